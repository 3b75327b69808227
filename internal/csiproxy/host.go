package csiproxy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/pkg/fsgroup"
)

// hostMount formats rec.Device when it holds no filesystem and mounts it on the target path, unless the
// target already is a mount point; with gid it then gives the volume the group under policy, as kubelet
// does for fsGroup.
// An ext2/3/4 filesystem smaller than its device (the volume was expanded while no pod used it) is grown
// to the device before it is mounted (growOffline). The mount is nodev and nosuid unless the flags say
// dev or suid (a StorageClass's mountOptions); a read-only one replays no journal (volume.ReadOnlyOptions).
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
			opts = append(append(opts, "ro"), volume.ReadOnlyOptions(rec.FsType, opts)...)
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

// holdForNode records with crustd that the node holds rec.Device for pod, before anything formats or
// mounts it: crustd refuses (FailedPrecondition, naming the holder's pod and runtime) while a sandbox
// holds the device, and refuses sandboxes the device from then until undoPublish ends the hold. A crustd
// that cannot record holds gets no host mount: the node would be a holder crustd does not know of.
func (p *Proxy) holdForNode(ctx context.Context, rec *Record, pod client.Pod) error {
	err := p.crust.HoldForNode(ctx, rec.Path, rec.Device, rec.ReadOnly, pod)
	if errors.Is(err, errdefs.ErrUnimplemented) {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "crustd cannot record that the node holds %s (it lacks "+
			"the %q feature): upgrade crustd; the proxy mounts no device on the node that crustd may give a sandbox",
			rec.Device, crustd.FeatureNodeHolds)
	}
	if err != nil {
		return fmt.Errorf("crustd: %w", err)
	}
	return nil
}

// ReconcileHolds makes crustd's holds of the node agree with the proxy's host mounts, as it must at the
// proxy's start, since crustd cannot tell a host mount that is gone: a hold at a target the proxy has no
// host-mount record for ends (its publish was undone), unless the target is a mount point all the same;
// and every host-mount record of this boot with a device gets its hold again (a crustd that lost it),
// each under its target's lock. A hold that crustd now refuses is logged at Error: the node mounts a
// device a sandbox holds.
func (p *Proxy) ReconcileHolds(ctx context.Context) error {
	resp, err := p.crust.Volumes().ListNodeHolds(ctx, &crustv1.ListNodeHoldsRequest{})
	if err != nil {
		return fmt.Errorf("crustd: list the node's holds: %w", err)
	}
	isHost := func(r *Record) bool { return r != nil && r.Kind == KindPublish && r.Mode == ModeHost && !r.Stale }
	held := map[string]bool{}
	var errs []error
	for _, h := range resp.GetHolds() {
		t := h.GetVolumeTargetPath()
		held[t] = true
		if isHost(p.journal.Get(KindPublish, t)) {
			continue
		}
		errs = append(errs, p.locked(ctx, KindPublish, t, func(rec *Record) error {
			if isHost(rec) {
				return nil
			}
			// A target mounted all the same (its record lost) keeps its hold: the node may still write.
			if notMnt, err := p.mounter.IsLikelyNotMountPoint(t); err == nil && !notMnt {
				p.log.Error("the node mounts a target the proxy has no record of; keeping crustd's hold on it", "target", t)
				return nil
			}
			p.log.Info("ending a hold of the node's that no host mount of the proxy's stands for", "target", t)
			return p.crust.ReleaseFromNode(ctx, t)
		}))
	}
	for _, r := range p.journal.List() {
		if !isHost(&r) || r.Device == "" || held[r.Path] {
			continue
		}
		errs = append(errs, p.locked(ctx, KindPublish, r.Path, func(rec *Record) error {
			if !isHost(rec) || rec.Device == "" {
				return nil
			}
			var pod client.Pod
			if t, ok := volume.ParseTargetPath(rec.Path); ok {
				pod.UID = t.PodUID
			}
			p.log.Info("recording again that the node holds a device it mounts", "target", rec.Path, "device", rec.Device)
			if err := p.holdForNode(ctx, rec, pod); err != nil {
				p.log.Error("the node mounts a device that crustd does not give it", "target", rec.Path, "device", rec.Device, "err", err)
				return err
			}
			return nil
		}))
	}
	return errors.Join(errs...)
}

// startReconcile runs ReconcileHolds until it succeeds once (crustd may come up after the proxy), backing
// off up to a minute between tries, or until ctx ends or stop is called; stop returns once the try in
// progress has ended.
func (p *Proxy) startReconcile(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: math.MaxInt32}
		_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
			if err := p.ReconcileHolds(ctx); err != nil {
				p.log.Warn("the node's holds in crustd are not yet reconciled with the host mounts; retrying", "err", err)
				return false, nil
			}
			p.log.Info("the node's holds in crustd agree with the host mounts")
			return true, nil
		})
	}()
	return func() { cancel(); <-done }
}

// locked runs fn on the record of kind at path (nil when none) under path's lock.
func (p *Proxy) locked(ctx context.Context, kind Kind, path string, fn func(*Record) error) error {
	rec, unlock, err := p.lockRecord(ctx, kind, path)
	if err != nil {
		return err
	}
	defer unlock()
	return fn(rec)
}
