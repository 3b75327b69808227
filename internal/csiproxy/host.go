package csiproxy

import (
	"errors"
	"os"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/pkg/fsgroup"
)

// hostMount formats rec.Device when it holds no filesystem and mounts it on the target path, unless the
// target already is a mount point; with gid it then gives the volume the group under policy, as kubelet
// does for fsGroup.
// An ext2/3/4 filesystem smaller than its device (the volume was expanded while no pod used it) is grown
// to the device before it is mounted (growOffline). The mount is nodev and nosuid unless the flags say
// dev or suid (a StorageClass's mountOptions).
func (p *Proxy) hostMount(rec *Record, flags []string, gid *int64, policy fsgroup.Policy) error {
	notMnt, err := p.mounter.IsLikelyNotMountPoint(rec.Path)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "check target path: %v", err)
	}
	if notMnt {
		// Only an ext volume can need it: a device holding another filesystem than the one asked for
		// does not mount, so for another type the probe would be a process spent for nothing.
		if !rec.ReadOnly && strings.HasPrefix(rec.FsType, "ext") {
			if err := p.growOffline(rec.Device); err != nil {
				return err
			}
		}
		opts := append([]string(nil), flags...)
		for _, o := range []string{"dev", "suid"} {
			if !slices.Contains(flags, o) && !slices.Contains(flags, "no"+o) {
				opts = append(opts, "no"+o)
			}
		}
		if rec.ReadOnly {
			opts = append(opts, "ro")
		}
		if err := p.mounter.FormatAndMount(rec.Device, rec.Path, rec.FsType, opts); err != nil {
			return errdefs.Errorf(errdefs.ErrInternal, "format and mount %s on %s: %v", rec.Device, rec.Path, err)
		}
	}
	if gid != nil && !rec.ReadOnly {
		if err := fsgroup.Apply(rec.Path, int(*gid), policy); err != nil {
			return errdefs.Errorf(errdefs.ErrInternal, "apply fsGroup %d: %v", *gid, err)
		}
	}
	return nil
}

// growOffline grows an ext2/3/4 filesystem on dev, which is not mounted, to fill dev; any other
// filesystem, or none, or one that fills its device already, is left alone. Offline growth needs no
// privilege beyond writing the device, while growing a mounted ext4 asks the kernel for
// CAP_SYS_RESOURCE, which a node may not give its pods: so after an offline expansion, kubelet's
// NodeExpandVolume that follows the mount finds nothing left to do. (xfs grows only mounted, and needs no
// such capability.)
func (p *Proxy) growOffline(dev string) error {
	format, err := p.mounter.GetDiskFormat(dev)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "filesystem on %s: %v", dev, err)
	}
	if format != "ext2" && format != "ext3" && format != "ext4" {
		return nil
	}
	fsBytes, block, err := volume.FilesystemBytes(dev, format)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "size of the filesystem: %v", err)
	}
	size, err := deviceSize(dev)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "%v", err)
	}
	if uint64(size) <= fsBytes+block {
		return nil
	}
	// resize2fs insists on a forced check of an unmounted filesystem first; -p repairs only what is safe
	// to repair without asking, and exits 1 when it did.
	if out, err := p.mounter.Exec.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		var exit utilexec.ExitError
		if !errors.As(err, &exit) || exit.ExitStatus() != 1 {
			return errdefs.Errorf(errdefs.ErrInternal, "check %s before growing it: %v: %s", dev, err, out)
		}
	}
	if out, err := p.mounter.Exec.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "grow the filesystem on %s: %v: %s", dev, err, out)
	}
	return nil
}

// hostUnmount unmounts the target path if it is mounted; it leaves the directory for removeTarget.
func (p *Proxy) hostUnmount(target string) error {
	for {
		notMnt, err := p.mounter.IsLikelyNotMountPoint(target)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			if mount.IsCorruptedMnt(err) {
				if uerr := p.mounter.Unmount(target); uerr != nil {
					return errdefs.Errorf(errdefs.ErrInternal, "unmount %s: %v", target, uerr)
				}
				continue
			}
			return errdefs.Errorf(errdefs.ErrInternal, "check target path: %v", err)
		}
		if notMnt {
			return nil
		}
		if err := p.mounter.Unmount(target); err != nil {
			return errdefs.Errorf(errdefs.ErrInternal, "unmount %s: %v", target, err)
		}
	}
}

// statfsUsage measures a mounted filesystem: bytes and inodes.
func statfsUsage(path string) (*csi.NodeGetVolumeStatsResponse, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "%s: %v", path, err)
		}
		return nil, errdefs.Errorf(errdefs.ErrInternal, "statfs %s: %v", path, err)
	}
	bs := int64(s.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(s.Blocks) * bs, Available: int64(s.Bavail) * bs, Used: int64(s.Blocks-s.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(s.Files), Available: int64(s.Ffree), Used: int64(s.Files - s.Ffree)},
	}}, nil
}
