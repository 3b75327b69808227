package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// The host block devices of the containers' linux.devices (CRI's raw block volumes): a node of each in
// the state directory's devicesDir, which QEMU opens, hot-plugged as a virtio-blk disk and made a node in
// the guest at guestDevices/<disk id>.
const (
	devicesDir   = "devices"
	guestDevices = "/run/crust/devices"
)

// deviceDetachTimeout bounds the detaching of one device.
const deviceDetachTimeout = 30 * time.Second

// guestCharDevices are the character devices (major, minor) a container's /dev in the guest has anyway.
var guestCharDevices = [][2]int64{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 1}, {5, 2}}

// hostDevice is a host block device in the VM, and the containers that use it.
type hostDevice struct {
	disk, node, guestPath string
	readOnly              bool
	users                 []string // container ids
}

// addDevices gives container id the devices of spec's linux.devices: a block device is hot-plugged (once
// for the sandbox, however many containers use it) and made at its path in the container; a character
// device is left out, as the guest has its own (a warning when the guest's /dev lacks it). The caller
// holds the service's lock.
func (s *sandbox) addDevices(ctx context.Context, id string, spec *specs.Spec) ([]*agentv1.ContainerDevice, error) {
	if spec.Linux == nil {
		return nil, nil
	}
	var out []*agentv1.ContainerDevice
	for i, d := range spec.Linux.Devices {
		switch d.Type {
		case "b":
		case "c", "u":
			if slices.Contains(guestCharDevices, [2]int64{d.Major, d.Minor}) {
				s.log.Debug("character device left to the guest's /dev", "container", id, "path", d.Path)
			} else {
				s.log.Warn("character device left out: the guest has no such device", "container", id, "path", d.Path,
					"major", d.Major, "minor", d.Minor)
			}
			continue
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "linux.devices[%d] (%s): type %q, want b or c", i, d.Path, d.Type)
		}
		if !filepath.IsAbs(d.Path) {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "linux.devices[%d].path %q: not absolute", i, d.Path)
		}
		dev, err := s.attachDevice(ctx, id, d.Major, d.Minor, deviceReadOnly(spec, d))
		if err != nil {
			return nil, fmt.Errorf("linux.devices[%d] (%s, block %d:%d): %w", i, d.Path, d.Major, d.Minor, err)
		}
		cd := &agentv1.ContainerDevice{Path: d.Path, Source: dev.guestPath, FileMode: 0o660}
		if d.FileMode != nil {
			cd.FileMode = uint32(d.FileMode.Perm())
		}
		if d.UID != nil {
			cd.Uid = *d.UID
		}
		if d.GID != nil {
			cd.Gid = *d.GID
		}
		out = append(out, cd)
	}
	return out, nil
}

// deviceReadOnly reports whether spec's device cgroup rules let the container read d but not write it.
func deviceReadOnly(spec *specs.Spec, d specs.LinuxDevice) bool {
	if spec.Linux.Resources == nil {
		return false
	}
	readOnly := false
	for _, r := range spec.Linux.Resources.Devices {
		if r.Type != "" && r.Type != "a" && r.Type != d.Type ||
			r.Major != nil && *r.Major != d.Major || r.Minor != nil && *r.Minor != d.Minor {
			continue
		}
		if r.Allow { // the last rule that matches decides
			readOnly = !strings.Contains(r.Access, "w")
		} else if strings.Contains(r.Access, "w") {
			readOnly = true
		}
	}
	return readOnly
}

// diskOf is the virtio-blk disk id of host block device major:minor.
func diskOf(major, minor int64) string { return fmt.Sprintf("dev-%d-%d", major, minor) }

// attachDevice adds container id to the users of host block device major:minor, attaching it first when
// no container of the sandbox uses it, once crustd says the device may go to the sandbox (CheckRawDevice):
// a node of it in the state directory (made, never followed), the
// disk hot-plugged from that node, the disk's node made in the guest. On an error nothing new is held.
func (s *sandbox) attachDevice(ctx context.Context, id string, major, minor int64, readOnly bool) (_ *hostDevice, err error) {
	disk := diskOf(major, minor)
	if dev := s.devices[disk]; dev != nil {
		if dev.readOnly != readOnly {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "the device is in the VM read-only=%t for containers %v",
				dev.readOnly, dev.users)
		}
		if !slices.Contains(dev.users, id) {
			dev.users = append(dev.users, id)
		}
		return dev, nil
	}
	// One writer per device: not a device the node has mounted or holds, nor one whose filesystem
	// another sandbox holds (raw devices shared between sandboxes are theirs).
	if err := s.crust.CheckRawDevice(ctx, s.id, uint32(major), uint32(minor), readOnly); err != nil { //nolint:gosec // device numbers fit
		if errors.Is(err, errdefs.ErrUnimplemented) {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "crustd cannot say whether the device is in use "+
				"(it lacks the %q feature): upgrade crustd", crustd.FeatureRawDeviceCheck)
		}
		return nil, fmt.Errorf("crustd: %w", err)
	}
	dev := &hostDevice{disk: disk, node: filepath.Join(s.dir, devicesDir, disk), guestPath: path.Join(guestDevices, disk),
		readOnly: readOnly, users: []string{id}}
	if err := makeBlockNode(dev.node, major, minor); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.detachDevice(context.WithoutCancel(ctx), dev))
		}
	}()
	if err := s.vm.AttachBlock(ctx, disk, dev.node, readOnly); err != nil {
		return nil, err
	}
	if _, err := s.vm.Agent().Mount(ctx, &agentv1.MountRequest{Serial: disk, Target: dev.guestPath, Block: true, ReadOnly: readOnly}); err != nil {
		return nil, fmt.Errorf("the disk's node in the guest: %w", err)
	}
	if s.devices == nil {
		s.devices = map[string]*hostDevice{}
	}
	s.devices[disk] = dev
	s.log.Info("host block device hot-plugged", "container", id, "disk", disk, "read_only", readOnly)
	return dev, nil
}

// makeBlockNode makes a block device node of major:minor at p, mode 0600, or checks that the one there is
// that device; a link or anything else at p is an error, never followed.
func makeBlockNode(p string, major, minor int64) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	rdev := unix.Mkdev(uint32(major), uint32(minor))
	err := unix.Mknod(p, unix.S_IFBLK|0o600, int(rdev))
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != rdev {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s exists and is not block device %d:%d", p, major, minor)
	}
	return nil
}

// removeDevices takes container id off the users of its devices and detaches those no container uses
// any more. The caller holds the service's lock.
func (s *sandbox) removeDevices(ctx context.Context, id string) error {
	var errs []error
	for disk, dev := range s.devices {
		if dev.users = slices.DeleteFunc(dev.users, func(u string) bool { return u == id }); len(dev.users) > 0 {
			continue
		}
		if err := s.detachDevice(ctx, dev); err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", disk, err))
			continue
		}
		delete(s.devices, disk)
		s.log.Info("host block device detached", "disk", disk)
	}
	return errors.Join(errs...)
}

// detachDevice removes dev's node in the guest, unplugs its disk and removes its node on the host, each
// step only when the one before succeeded.
func (s *sandbox) detachDevice(ctx context.Context, dev *hostDevice) error {
	ctx, cancel := context.WithTimeout(ctx, deviceDetachTimeout)
	defer cancel()
	if _, err := s.vm.Agent().Unmount(ctx, &agentv1.UnmountRequest{Target: dev.guestPath}); err != nil {
		return fmt.Errorf("removing its node in the guest: %w", err)
	}
	if err := s.vm.DetachBlock(ctx, dev.disk); err != nil {
		return err
	}
	if err := os.Remove(dev.node); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
