package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/mount"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vmhandler"
)

// guestMounts are the mount types the guest makes itself; others (cgroup) are left out.
var guestMounts = []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue"}

// prepareContainer mounts container id's rootfs and ordinary bind mounts under the sandbox's shared
// directory, attaches its crust volumes (those of kubelet's subPath mounts too, see attachVolume), and answers the guest's CreateContainer request for it. On an
// error the host's mounts of the container are undone (volumes attached stay the sandbox's, released at
// its teardown).
func (s *sandbox) prepareContainer(ctx context.Context, id, bundle string, rootfs []*types.Mount, spec *specs.Spec) (_ *agentv1.CreateContainerRequest, err error) {
	if spec.Root == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "container %s: the spec has no root", id)
	}
	hostDir := filepath.Join(s.dir, sharedDir, id)
	guestDir := path.Join(guestShared, id)
	defer func() {
		if err != nil {
			err = errors.Join(err, s.unprepareContainer(context.WithoutCancel(ctx), id, bundle, len(rootfs) > 0))
		}
	}()
	// The rootfs: containerd's mounts (overlay) on the bundle's rootfs, as runc's shim makes it, or the
	// bundle's own directory; then bound under the share.
	root := spec.Root.Path
	if !filepath.IsAbs(root) {
		root = filepath.Join(bundle, root)
	}
	if len(rootfs) > 0 {
		ms := make([]mount.Mount, 0, len(rootfs))
		for _, m := range rootfs {
			ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
		}
		if err := os.MkdirAll(root, 0o711); err != nil {
			return nil, err
		}
		if err := mount.All(ms, root); err != nil {
			return nil, fmt.Errorf("mounting the rootfs: %w", err)
		}
	}
	if err := bindInto(root, filepath.Join(hostDir, "rootfs"), false); err != nil {
		return nil, err
	}
	req := &agentv1.CreateContainerRequest{ContainerId: id, Root: path.Join(guestDir, "rootfs"),
		ReadOnlyRoot: spec.Root.Readonly, Hostname: spec.Hostname}
	for i, m := range spec.Mounts {
		if !isBind(m) {
			if slices.Contains(guestMounts, m.Type) {
				req.Mounts = append(req.Mounts, &agentv1.ContainerMount{Destination: m.Destination, Type: m.Type, Source: m.Source, Options: m.Options})
			}
			continue
		}
		src := filepath.Clean(m.Source)
		if s.set.podPath(src) {
			att, err := s.attachVolume(ctx, src)
			switch {
			case err == nil && att.Block:
				req.Devices = append(req.Devices, &agentv1.ContainerDevice{Path: m.Destination, Source: att.GuestPath, FileMode: 0o660})
				continue
			case err == nil: // a crust volume, mounted in the guest: never from the host
				s.log.Info("crust volume attached for the container", "container", id, "target", src, "destination", m.Destination)
				req.Mounts = append(req.Mounts, &agentv1.ContainerMount{Destination: m.Destination, Type: "bind", Source: att.GuestPath, Options: m.Options})
				continue
			case !vmhandler.ErrNotDeferred(err):
				return nil, fmt.Errorf("volume %s for %s: %w", src, m.Destination, err)
			}
		}
		n := strconv.Itoa(i)
		if err := bindInto(src, filepath.Join(hostDir, "mounts", n), slices.Contains(m.Options, "ro")); err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.Destination, err)
		}
		req.Mounts = append(req.Mounts, &agentv1.ContainerMount{Destination: m.Destination, Type: "bind",
			Source: path.Join(guestDir, "mounts", n), Options: m.Options})
	}
	devs, err := s.addDevices(ctx, id, spec)
	if err != nil {
		return nil, err
	}
	req.Devices = append(req.Devices, devs...)
	return req, nil
}

// unprepareContainer undoes prepareContainer's host mounts of container id and detaches the devices only
// it used.
func (s *sandbox) unprepareContainer(ctx context.Context, id, bundle string, mountedRootfs bool) error {
	err := unmountBelow(filepath.Join(s.dir, sharedDir, id))
	if err == nil {
		err = os.RemoveAll(filepath.Join(s.dir, sharedDir, id))
	}
	err = errors.Join(err, s.removeDevices(ctx, id))
	if mountedRootfs {
		err = errors.Join(err, mount.UnmountAll(filepath.Join(bundle, "rootfs"), unix.MNT_DETACH))
	}
	return err
}

// isBind reports whether m is a bind mount.
func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// bindInto bind-mounts src (recursively) at dst, made as a file or a directory like src, read-only when ro;
// the bind is a slave of src (mounts propagate from src to it, never back).
func bindInto(src, dst string, ro bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	if fi.IsDir() {
		err = os.Mkdir(dst, 0o700)
	} else {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, dst, err)
	}
	// A slave of src: what is mounted on the node later still shows (kubelet's mounts under a pod's
	// directory), but nothing done here reaches the node. On a node whose mounts are shared (kubelet's
	// are), a copy that stayed a peer would carry its unmount back: unmounting a hostPath "/" bind's
	// submounts here would unmount the node's /dev, /sys and /proc.
	if err := unix.Mount("", dst, "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		_ = unix.Unmount(dst, unix.MNT_DETACH)
		return fmt.Errorf("make the bind of %s at %s a slave: %w", src, dst, err)
	}
	if ro {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only bind %s at %s: %w", src, dst, err)
		}
	}
	return nil
}

// processOf is the guest's Process of an OCI process.
func processOf(p *specs.Process) (*agentv1.Process, error) {
	if p == nil || len(p.Args) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "the process has no args")
	}
	gp := &agentv1.Process{Args: p.Args, Env: p.Env, Cwd: p.Cwd, Uid: p.User.UID, Gid: p.User.GID,
		AdditionalGids: p.User.AdditionalGids, Terminal: p.Terminal, NoNewPrivileges: p.NoNewPrivileges}
	for _, r := range p.Rlimits {
		gp.Rlimits = append(gp.Rlimits, &agentv1.Rlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
	}
	if c := p.Capabilities; c != nil {
		gp.Bounding, gp.Effective, gp.Permitted, gp.Inheritable, gp.Ambient = c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient
	}
	return gp, nil
}
