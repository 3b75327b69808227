package lvmdriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"

	"crust.dev/crust/api/client"
	"crust.dev/crust/pkg/fsgroup"
)

// NodeGetCapabilities returns STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS, EXPAND_VOLUME and VOLUME_MOUNT_GROUP (the
// driver applies the pod's fsGroup itself, on the host or, deferred, through crust in the sandbox).
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo returns the node id and, with Config.Capacity, the node as its topology.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: d.cfg.NodeID}
	if t := d.topology(); len(t) > 0 {
		resp.AccessibleTopology = t[0]
	}
	return resp, nil
}

// deferred reports whether a mount volume with this context is deferred to crust.
func (d *Driver) deferred(volCtx map[string]string, c *csi.VolumeCapability) bool {
	return d.crust != nil && c.GetMount() != nil && volume.Deferred(volCtx)
}

// held reports whether crustd holds a descriptor at path (false when deferral is off).
func (d *Driver) held(ctx context.Context, path string) (bool, error) {
	if d.crust == nil {
		return false, nil
	}
	return d.crust.Holds(ctx, path)
}

// device returns the active device of a volume, activating it when needed. With Config.StrictAccessType it
// refuses (InvalidArgument) a block capability c for a volume created for filesystem use only; c may be
// nil, for a call that names no capability.
func (d *Driver) device(ctx context.Context, id string, c *csi.VolumeCapability) (string, error) {
	lv, err := d.lookup(ctx, id)
	if err != nil {
		return "", err
	}
	if d.cfg.StrictAccessType && c.GetBlock() != nil && lv.HasTag(filesystemTag) {
		return "", errdefs.Errorf(errdefs.ErrInvalidArgument,
			"volume_capability: volume %s was created for filesystem use; it is not published as a raw block device", id)
	}
	dev, err := d.act.activate(ctx, lv, false)
	if err != nil {
		return "", errdefs.Errorf(errdefs.ErrInternal, "activate %s: %v", id, err)
	}
	return dev, nil
}

// NodeStageVolume formats a blank mount volume and mounts it at the staging path; a block volume, or a
// deferred mount volume, needs nothing on the host. Staging again at the same path is a success; another
// device mounted there is AlreadyExists.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, staging, c := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	unlock, err := d.lockChecked(id, required("volume_id", id, "staging_target_path", staging),
		checkCapability("volume_capability", c))
	if err != nil {
		return nil, err
	}
	defer unlock()
	dev, err := d.device(ctx, id, c)
	if err != nil {
		return nil, err
	}
	if c.GetBlock() != nil || d.deferred(req.GetVolumeContext(), c) {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	if ok, err := mountedDevice(staging, dev); err != nil {
		return nil, err
	} else if ok {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "staging_target_path: %v", err)
	}
	if err := d.formatAndMount(dev, staging, c, c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume unmounts the staging path; nothing mounted there is a success. The directory stays
// (the CO owns it).
func (d *Driver) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	unlock, err := d.lockChecked(id, required("volume_id", id, "staging_target_path", staging))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.unmount(staging); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged filesystem (a mount volume) or the device node (a block volume)
// at the target path, read-only when asked, and applies the fsGroup to a mount volume; a deferred mount
// volume is deposited with crustd instead. Publishing again with the same parameters is a success; with
// others (another volume, another read-only flag) AlreadyExists.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target, staging, c := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	eph := isEphemeral(req.GetVolumeContext())
	unlock, err := d.lockChecked(id, required("volume_id", id, "target_path", target),
		checkCapability("volume_capability", c), checkStaged(c, staging, eph))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if eph {
		if _, err := d.createEphemeral(ctx, req); err != nil {
			return nil, err
		}
	}
	dev, err := d.device(ctx, id, c)
	if err != nil {
		return nil, err
	}
	ro := req.GetReadonly() || c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY

	if d.deferred(req.GetVolumeContext(), c) {
		var resp *csi.NodePublishVolumeResponse
		err := intoTarget(target, func() (err error) {
			resp, err = d.crust.Publish(ctx, req, dev, client.CreateFilesystem(), client.DefaultFSType(d.cfg.DefaultFSType))
			return err
		})
		return resp, err
	}

	if c.GetBlock() != nil {
		return d.publishBlock(dev, target, ro)
	}
	if eph {
		return d.publishEphemeralMount(dev, target, c, ro)
	}
	if ok, err := mountedDevice(staging, dev); err != nil {
		return nil, err
	} else if !ok {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is not staged at %s", id, staging)
	}
	if ok, err := sameMount(target, staging, ro); err != nil {
		return nil, err
	} else if ok {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := intoTarget(target, func() error { return d.bind(staging, target, ro) }); err != nil {
		return nil, err
	}
	return d.giveMountGroup(target, c, ro)
}

// intoTarget makes the target path (a directory) when it is missing and runs put, which mounts something
// there; when put fails, a target intoTarget made is removed again. It returns put's error.
func intoTarget(target string, put func() error) error {
	created, err := mkdir(target)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "target_path: %v", err)
	}
	err = put()
	if err != nil && created {
		_ = os.Remove(target)
	}
	return err
}

// bind bind-mounts src at target, read-only when ro.
func (d *Driver) bind(src, target string, ro bool) error {
	opts := []string{"bind"}
	if ro {
		opts = append(opts, "ro")
	}
	if err := d.mounter.Mount(src, target, "", opts); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "bind %s at %s: %v", src, target, err)
	}
	return nil
}

// formatAndMount formats dev when it holds no filesystem and mounts it at path with the capability's
// filesystem (DefaultFSType when it names none) and mount flags, read-only when ro (replaying no journal:
// volume.ReadOnlyOptions).
func (d *Driver) formatAndMount(dev, path string, c *csi.VolumeCapability, ro bool) error {
	fsType := c.GetMount().GetFsType()
	if fsType == "" {
		fsType = d.cfg.DefaultFSType
	}
	opts := slices.Clone(c.GetMount().GetMountFlags())
	if ro { // and no journal replayed: other read-only holders may read the device
		opts = append(append(opts, "ro"), volume.ReadOnlyOptions(fsType, opts)...)
	}
	if err := d.mounter.FormatAndMount(dev, path, fsType, opts); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "format and mount %s at %s: %v", dev, path, err)
	}
	return nil
}

// giveMountGroup gives a published filesystem the capability's volume_mount_group (the pod's fsGroup),
// unless it is read-only; when that fails it unmounts the target.
func (d *Driver) giveMountGroup(target string, c *csi.VolumeCapability, ro bool) (*csi.NodePublishVolumeResponse, error) {
	if g := c.GetMount().GetVolumeMountGroup(); g != "" && !ro {
		if err := applyGroup(target, g); err != nil {
			_ = d.unmount(target)
			return nil, err
		}
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *Driver) publishBlock(dev, target string, ro bool) (*csi.NodePublishVolumeResponse, error) {
	var devSt, tSt unix.Stat_t
	if err := unix.Stat(dev, &devSt); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "stat %s: %v", dev, err)
	}
	if mp, err := isMountPoint(target); err != nil {
		return nil, err
	} else if mp {
		if err := unix.Stat(target, &tSt); err == nil && tSt.Mode&unix.S_IFMT == unix.S_IFBLK && tSt.Rdev == devSt.Rdev {
			if readOnlyMount(target) == ro {
				return &csi.NodePublishVolumeResponse{}, nil
			}
		}
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "target_path %s is published with another volume or read-only flag", target)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "target_path: %v", err)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "target_path: %v", err)
	}
	_ = f.Close()
	if err := d.bind(dev, target, ro); err != nil {
		_ = os.Remove(target)
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target path and removes it (a target crustd holds is unpublished
// through crust); a target that is gone already is a success.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	unlock, err := d.lockChecked(id, required("volume_id", id, "target_path", target))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if held, err := d.held(ctx, target); err != nil {
		return nil, err
	} else if held {
		if _, err := d.crust.Unpublish(ctx, req); err != nil {
			return nil, err
		}
	} else if err := d.unmount(target); err != nil {
		return nil, err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "remove target_path: %v", err)
	}
	if err := d.removeEphemeral(ctx, id); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// publishEphemeralMount formats (when blank) and mounts an inline ephemeral volume's device straight at
// the target path: such a volume has no staging path.
func (d *Driver) publishEphemeralMount(dev, target string, c *csi.VolumeCapability, ro bool) (*csi.NodePublishVolumeResponse, error) {
	if ok, err := mountedDevice(target, dev); err != nil {
		return nil, err
	} else if ok {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := intoTarget(target, func() error { return d.formatAndMount(dev, target, c, ro) }); err != nil {
		return nil, err
	}
	return d.giveMountGroup(target, c, ro)
}

// NodeGetVolumeStats reports statfs bytes and inodes of a mount volume, the device size of a block
// volume, and what the sandbox measures for a deferred one. NotFound when the volume does not exist or is
// not at that path.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := required("volume_id", id, "volume_path", path); err != nil {
		return nil, err
	}
	dev, err := d.device(ctx, id, nil)
	if err != nil {
		return nil, err
	}
	if held, err := d.held(ctx, path); err != nil {
		return nil, err
	} else if held {
		return d.crust.Stats(ctx, req)
	}
	kind, err := volumeAt(path, dev)
	if err != nil {
		return nil, err
	}
	if kind == blockVolume {
		size, err := deviceSize(path)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "size of %s: %v", path, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Total: size, Unit: csi.VolumeUsage_BYTES}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "statfs %s: %v", path, err)
	}
	bs := st.Bsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs,
			Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

// NodeExpandVolume grows the filesystem of a mount volume online to fill its device (resize2fs,
// xfs_growfs); a block volume needs nothing; a deferred volume is grown by its sandbox through crust.
// The device must already have the size asked (ControllerExpandVolume), or it is OutOfRange.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	unlock, err := d.lockChecked(id, required("volume_id", id, "volume_path", path),
		checkOptionalCapability("volume_capability", req.GetVolumeCapability()),
		checkRange("capacity_range", req.GetCapacityRange()))
	if err != nil {
		return nil, err
	}
	defer unlock()
	lv, err := d.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if r := req.GetCapacityRange().GetRequiredBytes(); r > lv.Size {
		return nil, errdefs.Errorf(errdefs.ErrOutOfRange, "capacity_range: volume %s has %d bytes; expand it on the controller first", id, lv.Size)
	}
	dev, err := d.act.activate(ctx, lv, false)
	if err == nil {
		err = d.act.refresh(ctx, lv)
	}
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "activate %s: %v", id, err)
	}
	if held, err := d.held(ctx, path); err != nil {
		return nil, err
	} else if held {
		return d.crust.Expand(ctx, req)
	}
	kind, err := volumeAt(path, dev)
	if err != nil {
		return nil, err
	}
	if kind == mountVolume {
		if _, err := d.resizer.Resize(dev, path); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "grow the filesystem at %s: %v", path, err)
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: lv.Size}, nil
}

// lockChecked returns the first non-nil of checks (the request's checks, all evaluated by the caller), or
// else takes the volume's lock (tryLock: Aborted while another call works on id). A request that is wrong
// in itself so gets its own error whether or not the volume is busy.
func (d *Driver) lockChecked(id string, checks ...error) (unlock func(), err error) {
	if err := firstError(checks...); err != nil {
		return nil, err
	}
	return d.busy.tryLock(id)
}

// firstError returns the first non-nil of errs (a request's checks, evaluated by the caller), or nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkStaged refuses (FailedPrecondition) to publish a mount volume without a staging path, unless it is
// an inline ephemeral volume: the driver advertises STAGE_UNSTAGE_VOLUME, so publishing what was never
// staged is out of order.
func checkStaged(c *csi.VolumeCapability, staging string, ephemeral bool) error {
	if c.GetMount() != nil && staging == "" && !ephemeral {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "staging_target_path: is required (the driver stages volumes; stage the volume first)")
	}
	return nil
}

// --- host helpers ---

// required refuses (InvalidArgument) the first of its field name, value pairs whose value is empty.
func required(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: is required", pairs[i])
		}
	}
	return nil
}

// unmount unmounts path when something is mounted there.
func (d *Driver) unmount(path string) error {
	mp, err := isMountPoint(path)
	if err != nil || !mp {
		return err
	}
	if err := d.mounter.Unmount(path); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "unmount %s: %v", path, err)
	}
	return nil
}

// isMountPoint reports whether something is mounted at path; a missing path is not.
func isMountPoint(path string) (bool, error) {
	mp, err := mount.New("").IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, errdefs.Errorf(errdefs.ErrInternal, "%s: %v", path, err)
	}
	return mp, nil
}

// mountedDevice reports whether dev's filesystem is mounted at path; another one mounted there is
// AlreadyExists.
func mountedDevice(path, dev string) (bool, error) {
	mp, err := isMountPoint(path)
	if err != nil || !mp {
		return false, err
	}
	var pSt, dSt unix.Stat_t
	if err := unix.Stat(path, &pSt); err != nil {
		return false, errdefs.Errorf(errdefs.ErrInternal, "stat %s: %v", path, err)
	}
	if err := unix.Stat(dev, &dSt); err != nil {
		return false, errdefs.Errorf(errdefs.ErrInternal, "stat %s: %v", dev, err)
	}
	if pSt.Dev != dSt.Rdev {
		return false, errdefs.Errorf(errdefs.ErrAlreadyExists, "another filesystem is mounted at %s", path)
	}
	return true, nil
}

// sameMount reports whether target already shows staging's filesystem with the read-only flag ro;
// another mount there is AlreadyExists.
func sameMount(target, staging string, ro bool) (bool, error) {
	mp, err := isMountPoint(target)
	if err != nil || !mp {
		return false, err
	}
	var tSt, sSt unix.Stat_t
	if err := unix.Stat(target, &tSt); err != nil {
		return false, errdefs.Errorf(errdefs.ErrInternal, "stat %s: %v", target, err)
	}
	if err := unix.Stat(staging, &sSt); err != nil {
		return false, errdefs.Errorf(errdefs.ErrInternal, "stat %s: %v", staging, err)
	}
	if tSt.Dev != sSt.Dev || readOnlyMount(target) != ro {
		return false, errdefs.Errorf(errdefs.ErrAlreadyExists, "target_path %s is published with another volume or read-only flag", target)
	}
	return true, nil
}

// readOnlyMount reports whether the mount at path is read-only.
func readOnlyMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Flags&unix.ST_RDONLY != 0
}

type volumeKind int

const (
	mountVolume volumeKind = iota
	blockVolume
)

// volumeAt says how the volume on dev is at path, or NotFound when it is not there.
func volumeAt(path, dev string) (volumeKind, error) {
	var pSt, dSt unix.Stat_t
	if err := unix.Stat(path, &pSt); err != nil {
		return 0, errdefs.Errorf(errdefs.ErrNotFound, "volume_path %s: %v", path, err)
	}
	if err := unix.Stat(dev, &dSt); err != nil {
		return 0, errdefs.Errorf(errdefs.ErrInternal, "stat %s: %v", dev, err)
	}
	switch {
	case pSt.Mode&unix.S_IFMT == unix.S_IFBLK && pSt.Rdev == dSt.Rdev:
		return blockVolume, nil
	case pSt.Mode&unix.S_IFMT == unix.S_IFDIR && pSt.Dev == dSt.Rdev:
		return mountVolume, nil
	}
	return 0, errdefs.Errorf(errdefs.ErrNotFound, "the volume is not at %s", path)
}

func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	return f.Seek(0, io.SeekEnd)
}

// mkdir makes dir (mode 0750) and says whether it made it.
func mkdir(dir string) (bool, error) {
	if _, err := os.Stat(dir); err == nil {
		return false, nil
	}
	return true, os.MkdirAll(dir, 0o750)
}

// applyGroup gives the filesystem at root to group gid as kubelet does for fsGroup (see pkg/fsgroup).
func applyGroup(root, g string) error {
	gid, err := strconv.Atoi(g)
	if err != nil || gid < 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "volume_capability.mount.volume_mount_group: %q is not a group id", g)
	}
	if err := fsgroup.Apply(root, gid, fsgroup.Always); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "apply fsGroup %d at %s: %v", gid, root, fmt.Errorf("%w", err))
	}
	return nil
}
