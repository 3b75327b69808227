package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	crusthandler "crust.dev/crust/api/handler"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/podnet"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/examples/microvm/vmhandler"
)

// A sandbox's state directory, Settings.StateDir/<first 16 of the sandbox id>, holds:
//
//	shared/        exported to the guest over virtio-fs as shareTag, mounted there at guestShared:
//	  <id>/rootfs    the container's rootfs (a bind of its bundle's rootfs)
//	  <id>/mounts/N  the container's N-th OCI mount, when it is an ordinary bind mount
//	devices/       a node of each host block device of the containers' linux.devices, hot-plugged
//	handler.sock   RuntimeHandlerService, for crustd
//	qemu.pid       QEMU's pid, for the delete action after a dead shim
//	and the VM's own sockets and logs (package vm).
const (
	sharedDir     = "shared"
	shareTag      = "crust-shared"
	guestShared   = "/run/crust/shared"
	handlerSocket = "handler.sock"
	pidFile       = "qemu.pid"
)

// sandbox is the sandbox's VM, its network and its volumes.
type sandbox struct {
	id      string
	dir     string
	set     Settings
	net     *podnet.Link // nil without a pod network
	vm      *vm.VM
	crust   *crusthandler.Client
	volumes *vmhandler.Volumes
	devices map[string]*hostDevice // by disk id
	log     *slog.Logger
}

// bootSandbox boots the sandbox's VM with its shared directory and, when the sandbox container's spec
// names a network namespace, the pod's network (its address answering from the guest); it mounts the
// share in the guest and serves the volumes. On an error nothing is left running.
func bootSandbox(ctx context.Context, set Settings, id string, spec *specs.Spec, log *slog.Logger) (_ *sandbox, err error) {
	dir := set.sandboxDir(id)
	shared := filepath.Join(dir, sharedDir)
	if err := os.MkdirAll(shared, 0o700); err != nil {
		return nil, err
	}
	s := &sandbox{id: id, dir: dir, set: set, log: log}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.teardown(context.WithoutCancel(ctx)))
		}
	}()
	if s.crust, err = crusthandler.Dial(set.CrustSocket); err != nil {
		return s, err
	}
	if s.net, err = podNetwork(spec); err != nil {
		return s, fmt.Errorf("the pod's network: %w", err)
	}
	memoryMB, cpus, err := vmSize(set, spec)
	if err != nil {
		return s, errdefs.Errorf(errdefs.ErrInvalidArgument, "the sandbox's spec: %v", err)
	}
	start := time.Now()
	s.vm, err = vm.Start(ctx, vm.Config{
		Kernel: filepath.Join(set.Assets, "cloud", "vmlinux"), Initramfs: filepath.Join(set.Assets, "initramfs-cloud.cpio"),
		Accel: set.Accel, MemoryMB: memoryMB, CPUs: cpus, StateDir: dir,
		// chroot, not virtiofsd's namespace sandbox: the containers' mounts made under the shared
		// directory after virtiofsd started must be seen through it.
		FSShares: []vm.FSShare{{Tag: shareTag, Path: shared, DaemonArgs: []string{"-o", "sandbox=chroot"}}},
		NICs:     nics(s.net),
	})
	if err != nil {
		return s, err
	}
	boot := s.vm.Boot()
	log.Info("VM up", "memory_mb", memoryMB, "vcpus", cpus, "accel", boot.Accel, "boot", boot.Took.Round(time.Millisecond), "kernel", boot.Kernel,
		"qemu_pid", s.vm.Pid(), "since_create", time.Since(start).Round(time.Millisecond))
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(s.vm.Pid())+"\n"), 0o600); err != nil {
		return s, err
	}
	if s.net != nil {
		if err := configureNetwork(ctx, s.vm.Agent(), s.net); err != nil {
			return s, err
		}
		log.Info("pod network in the guest", "interface", s.net.Interface.Name, "addresses", fmt.Sprint(s.net.Interface.Addrs))
	}
	if _, err := s.vm.Agent().MountShare(ctx, &agentv1.MountShareRequest{Tag: shareTag, Target: guestShared}); err != nil {
		return s, fmt.Errorf("mounting the shared directory in the guest: %w", err)
	}
	s.volumes, err = vmhandler.ServeVolumes(vmhandler.VolumesConfig{SandboxID: id, Crust: s.crust, VM: s.vm,
		HandlerSocket: filepath.Join(dir, handlerSocket), Log: log})
	return s, err
}

// teardown releases every volume, stops the VM, undoes the host's mounts under the state directory and
// removes it.
func (s *sandbox) teardown(ctx context.Context) error {
	var errs []error
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	switch {
	case s.volumes != nil:
		errs = append(errs, s.volumes.Teardown(ctx)) // stops the VM too
	case s.vm != nil:
		errs = append(errs, s.vm.Stop(ctx))
	}
	if s.crust != nil {
		_ = s.crust.Close()
	}
	if s.net != nil {
		errs = append(errs, s.net.Close()) // after the VM: QEMU held the tap
	}
	errs = append(errs, cleanSandbox(s.dir))
	return errors.Join(errs...)
}

// cleanSandbox kills a QEMU left in dir by a dead shim, undoes the mounts below dir and removes it.
func cleanSandbox(dir string) error {
	_ = vmhandler.KillStaleQEMU(dir, pidFile)
	if err := unmountBelow(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// unmountBelow unmounts every mount at or below dir, the deepest first, each made a slave first so that
// no unmount propagates out of dir to a peer (the node's own mounts, when a bind of them is shared).
func unmountBelow(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return err
	}
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	var errs []error
	for _, m := range slices.Backward(mounts) { // the shallowest first: MS_REC covers what is below
		if err := unix.Mount("", m.Mountpoint, "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("make %s a slave: %w", m.Mountpoint, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // unmounting now could unmount the node's mounts
	}
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
