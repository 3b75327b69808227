// Package shim is containerd-shim-crust-microvm-v1, crust-microvm as a containerd runtime v2 shim
// (runtime_type io.containerd.crust-microvm.v1), on containerd's shim library (task API v2, which
// containerd 1.6, 1.7 and 2.x speak).
//
// What it promises:
//   - One shim process and one QEMU microVM per sandbox: a container whose CRI annotations name it a
//     sandbox, or that has none (ctr run), boots the VM at its Create; every other container goes, by
//     its io.kubernetes.cri.sandbox-id annotation, to its sandbox's shim and runs in that VM.
//   - Every container runs in the guest (crust-guest's container API): its rootfs and its ordinary
//     bind mounts are mounted on the host under the sandbox's shared directory, which one virtiofsd
//     (chroot sandbox, so that later mounts are seen) exports to the guest; a bind mount whose source is a
//     target path crustd holds a descriptor for is claimed for the sandbox, hot-plugged and mounted in the
//     guest (examples/microvm/vmhandler's Volumes), and never mounted on the host.
//   - A block device of a container's linux.devices (CRI's raw block volume) is the host's device given
//     to the VM: a node of it in the state directory (mknod by its major and minor) is hot-plugged as a
//     virtio-blk disk, once per sandbox, and made at the spec's path in the container; it leaves the VM
//     when the last container using it is deleted. Character devices are the guest's own.
//   - Stats answers cgroups v1's Metrics of the container's processes as the guest measures them (CPU
//     time, resident memory, how many).
//   - stdio goes between containerd's FIFOs and the guest; exit statuses, exec, signals, terminals and
//     containerd's task events (create, start, exit, delete, exec added, exec started) are as runc's.
//     The pid containerd sees for every task is QEMU's.
//   - At the sandbox container's Delete (or Shutdown, SIGTERM, SIGINT): every container removed, every
//     volume unmounted, unplugged and released, the VM stopped, the host's mounts undone and the state
//     directory removed; the shim's process exits only once that is done (or after two minutes).
//     QEMU and virtiofsd die with the shim; a dead shim's claims are released by crustd after its
//     handler grace.
//
// Settings are environment variables (containerd passes its own to shims); see Settings.
package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/runtime/v2/shim"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	crusthandler "crust.dev/crust/api/handler"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/examples/microvm/vmhandler"
)

// RuntimeType is the runtime_type containerd is configured with for this shim.
const RuntimeType = "io.containerd.crust-microvm.v1"

// The CRI annotations that group containers into sandboxes.
const (
	annotationSandboxID     = "io.kubernetes.cri.sandbox-id"
	annotationContainerType = "io.kubernetes.cri.container-type"
)

// Settings are the shim's settings, from the environment.
type Settings struct {
	// CrustSocket is crustd's socket: CRUST_SOCKET, default /run/crust/crust.sock.
	CrustSocket string
	// Assets holds the guest kernel and initramfs (as crust-microvm's --assets): CRUST_MICROVM_ASSETS,
	// default /usr/share/crust/guest.
	Assets string
	// StateDir is the parent of the sandboxes' state directories: CRUST_MICROVM_STATE_DIR, default
	// /run/crust-microvm.
	StateDir string
	// Accel is QEMU's accelerator (auto, kvm, tcg): CRUST_MICROVM_ACCEL, default auto.
	Accel vm.Accel
	// MemoryMB is the guest's own memory, to which the pod's containers' memory limits are added:
	// CRUST_MICROVM_MEMORY_MB, default 512.
	MemoryMB int
	// KubeletDir is kubelet's root directory, crustd's --kubelet-dir: CRUST_KUBELET_DIR, default
	// /var/lib/kubelet. Only a bind mount from a pod's directory under it can be a crust volume; the
	// others (the sandbox's /dev/shm, /etc/hosts and the like from containerd's state) are not asked of
	// crustd.
	KubeletDir string
}

// SettingsFromEnv reads the settings from the environment.
func SettingsFromEnv() (Settings, error) {
	get := func(name, def string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	}
	s := Settings{
		CrustSocket: get("CRUST_SOCKET", crusthandler.DefaultSocket),
		Assets:      get("CRUST_MICROVM_ASSETS", vmhandler.DefaultAssets),
		StateDir:    get("CRUST_MICROVM_STATE_DIR", vmhandler.DefaultStateDir),
		Accel:       vm.Accel(get("CRUST_MICROVM_ACCEL", string(vm.AccelAuto))),
		KubeletDir:  filepath.Clean(get("CRUST_KUBELET_DIR", "/var/lib/kubelet")),
	}
	if !filepath.IsAbs(s.KubeletDir) {
		return s, fmt.Errorf("CRUST_KUBELET_DIR=%q: want an absolute path", s.KubeletDir)
	}
	if m := os.Getenv("CRUST_MICROVM_MEMORY_MB"); m != "" {
		n, err := strconv.Atoi(m)
		if err != nil || n <= 0 {
			return s, fmt.Errorf("CRUST_MICROVM_MEMORY_MB=%q: want a positive number of MiB", m)
		}
		s.MemoryMB = n
	}
	return s, nil
}

// podPath reports whether p lies in a pod's directory under kubelet's root, where kubelet's volume
// target paths are.
func (s Settings) podPath(p string) bool {
	return strings.HasPrefix(p, filepath.Join(s.KubeletDir, "pods")+"/")
}

// sandboxDir is the state directory of sandbox id: short, for the unix sockets in it.
func (s Settings) sandboxDir(id string) string {
	return filepath.Join(s.StateDir, id[:min(16, len(id))])
}

// Run is the shim binary's main: containerd runs it with start, delete, or to serve.
func Run() {
	registerTaskPlugin()
	shim.RunManager(context.Background(), manager{},
		// QEMU and virtiofsd are waited for by package vm: the library's reaper would take their exits.
		func(c *shim.Config) { c.NoReaper, c.NoSubreaper = true, true })
}

// manager is the shim's start and delete actions.
type manager struct{}

func (manager) Name() string { return RuntimeType }

// readSpec reads the OCI spec of the bundle at dir.
func readSpec(dir string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("%s/config.json: %w", dir, err)
	}
	return &spec, nil
}

// sandboxOf is the sandbox id of container id by its spec's CRI annotations: its own id for a sandbox
// container or one without them.
func sandboxOf(id string, spec *specs.Spec) (sandbox string, isSandbox bool) {
	a := spec.Annotations
	if sb := a[annotationSandboxID]; sb != "" && a[annotationContainerType] != "sandbox" {
		return sb, false
	}
	return id, true
}

// Start starts the sandbox's shim, or finds it running, and answers its address. Its working directory
// is the container's bundle.
func (manager) Start(ctx context.Context, id string, opts shim.StartOpts) (string, error) {
	spec, err := readSpec(".")
	if err != nil {
		return "", err
	}
	group, _ := sandboxOf(id, spec)
	address, err := shim.SocketAddress(ctx, opts.Address, group)
	if err != nil {
		return "", err
	}
	l, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return "", fmt.Errorf("shim socket: %w", err)
		}
		if shim.CanConnect(address) { // the sandbox's shim serves: this container is its
			return address, shim.WriteAddress("address", address)
		}
		if err := shim.RemoveSocket(address); err != nil {
			return "", fmt.Errorf("removing the stale shim socket: %w", err)
		}
		if l, err = shim.NewSocket(address); err != nil {
			return "", fmt.Errorf("shim socket: %w", err)
		}
	}
	l.SetUnlinkOnClose(false) // the socket is the server's once started
	defer func() { _ = l.Close() }()
	f, err := l.File()
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	args := []string{"-id", id}
	if opts.Debug {
		args = append(args, "-debug")
	}
	// The server outlives this start action, whose context ends with it.
	cmd, err := shim.Command(context.WithoutCancel(ctx), &shim.CommandConfig{Runtime: self, Address: opts.Address,
		TTRPCAddress: opts.TTRPCAddress, Path: cwd, Args: args})
	if err != nil {
		return "", err
	}
	cmd.ExtraFiles = []*os.File{f} // fd 3: the library serves the listener it finds there
	if err := cmd.Start(); err != nil {
		_ = shim.RemoveSocket(address)
		return "", err
	}
	go func() { _ = cmd.Wait() }()
	if err := shim.WriteAddress("address", address); err != nil {
		_ = cmd.Process.Kill()
		_ = shim.RemoveSocket(address)
		return "", err
	}
	return address, nil
}

// Stop is the delete action, which containerd runs when the shim is gone: it undoes on the host what the
// dead shim left of container id (its mounts; for a sandbox its QEMU, its shared mounts and its state
// directory) and answers the task as killed. Its working directory is the container's bundle.
func (manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("container", id)
	set, err := SettingsFromEnv()
	if err != nil {
		return shim.StopStatus{}, err
	}
	ns, _ := namespaces.Namespace(ctx)
	cwd, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	spec, err := readSpec(cwd)
	group := id
	if err == nil {
		group, _ = sandboxOf(id, spec)
	}
	dir := set.sandboxDir(group)
	err = errors.Join(unmountBelow(filepath.Join(dir, sharedDir, id)), unmountBelow(filepath.Join(cwd, "rootfs")))
	if group == id {
		err = errors.Join(err, cleanSandbox(dir))
	}
	if err != nil {
		log.Error("cleaning up after a dead shim", "namespace", ns, "err", err)
	}
	return shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(syscall.SIGKILL)}, nil
}
