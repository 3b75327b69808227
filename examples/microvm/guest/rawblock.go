//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// A raw block volume is exposed as a block device node made with mknod at the target, carrying the
// disk's major:minor: what an OCI runtime makes for a container's device, with nothing mounted, so
// that removing it is an unlink and nothing is left in the mount table. The node must go before its
// disk is unplugged (the handler's detach unexposes first): a later disk may get the same numbers.

// expose makes the node at args.Target for the disk with args.Serial, after waiting for the disk. A node
// of the same disk already there is success (Already); anything else there is failed_precondition.
func (v *volumes) expose(ctx context.Context, args *agentv1.MountRequest) (*agentv1.MountResponse, error) {
	if err := checkTarget(args.Target); err != nil {
		return nil, err
	}
	switch {
	case args.Serial == "" || len(args.Serial) > maxSerial:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "serial %q must be 1 to %d bytes", args.Serial, maxSerial)
	case args.FsType != "" || len(args.Options) > 0 || args.FsGroup != nil || args.FsGroupPolicy != agentv1.FsGroupPolicy_FS_GROUP_POLICY_UNSPECIFIED || args.CreateFilesystem:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument,
			"a raw block volume takes no fs_type, options, fs_group, fs_group_policy or create_filesystem")
	case args.DeviceWaitMillis < 0:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "negative device wait")
	}
	wait := min(time.Duration(args.DeviceWaitMillis)*time.Millisecond, maxDeviceWait)
	if wait == 0 {
		wait = defaultDeviceWait
	}
	v.op.Lock()
	defer v.op.Unlock()
	dev, err := waitDisk(ctx, args.Serial, wait, v.held())
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %v", dev, err)
	}
	res := &agentv1.MountResponse{Device: dev}
	vol := &volume{serial: args.Serial, device: dev, readOnly: args.ReadOnly, block: true}
	var there unix.Stat_t
	switch err := unix.Lstat(args.Target, &there); {
	case err == nil && there.Mode&unix.S_IFMT == unix.S_IFBLK && there.Rdev == st.Rdev:
		v.set(args.Target, vol)
		res.Already = true
		return res, nil
	case err == nil:
		return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition,
			"%s exists and is not the device node of %s", args.Target, dev)
	case !errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("%v", err)
	}
	if err := os.MkdirAll(filepath.Dir(args.Target), 0o755); err != nil {
		return nil, fmt.Errorf("%v", err)
	}
	mode := uint32(0o660)
	if args.ReadOnly {
		mode = 0o440 // the disk itself is read-only; the mode says so to whoever looks
	}
	if err := unix.Mknod(args.Target, unix.S_IFBLK|mode, int(st.Rdev)); err != nil {
		return nil, fmt.Errorf("mknod %s: %v", args.Target, err)
	}
	v.set(args.Target, vol)
	logger.Printf("exposed %s (serial %s, %d:%d) at %s", dev, args.Serial, unix.Major(st.Rdev), unix.Minor(st.Rdev), args.Target)
	return res, nil
}

// unexpose removes the node exposed at target; one already gone is not an error. The caller holds v.op.
func (v *volumes) unexpose(target string) error {
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %v", target, err)
	}
	v.set(target, nil)
	logger.Printf("removed the device node %s", target)
	return nil
}

// blockStatfs answers statfs for a raw block volume: the disk's size as the total bytes (what CSI asks
// of a block volume; nothing is used or available on a raw device), no inodes, and abnormal when the
// disk is gone.
func blockStatfs(vol *volume) *agentv1.StatfsResponse {
	size, err := deviceSize(vol.device)
	if err != nil {
		return &agentv1.StatfsResponse{Abnormal: true, Message: "device " + vol.device + " is gone"}
	}
	return &agentv1.StatfsResponse{Bytes: &agentv1.Usage{Total: size}}
}

// blockGrow answers grow for a raw block volume: nothing to grow on the device, so it waits for the disk
// to show the size and reports it as the capacity.
func blockGrow(ctx context.Context, vol *volume, args *agentv1.GrowRequest) (*agentv1.GrowResponse, error) {
	if vol.readOnly {
		return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s is read-only", args.Target)
	}
	size, err := waitDeviceSize(ctx, vol.device, args.MinDeviceBytes, growWait)
	if err != nil {
		return nil, err
	}
	logger.Printf("raw device %s at %s is %d bytes", vol.device, args.Target, size)
	return &agentv1.GrowResponse{DeviceBytes: size, CapacityBytes: size}, nil
}
