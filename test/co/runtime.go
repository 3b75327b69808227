package co

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
)

// Runtime starts pods: the CRI runtime behind one runtime handler.
type Runtime interface {
	// Start starts pod's sandbox and containers with each mount's host path (kubelet's target path) at
	// its container path, and returns once the containers would run.
	Start(ctx context.Context, pod *Pod, mounts []Mount) (Sandbox, error)
}

// Mount is a volume as the runtime gets it from kubelet.
type Mount struct {
	// HostPath is the publish target path; ContainerPath where the container sees it.
	HostPath, ContainerPath string
	ReadOnly                bool
}

// Sandbox is a started pod.
type Sandbox interface {
	// Stop stops the containers and the sandbox; the volumes are no longer used once it returns.
	Stop(ctx context.Context) error
}

// --- runc ---

// Host is the runtime of ordinary containers (runc): it bind-mounts each target path into the
// container, so what the container sees is what is mounted on the host there. Start fails when a target
// path holds no mounted filesystem: the container would get an empty directory instead of the volume.
type Host struct{}

// HostSandbox is a pod started by Host.
type HostSandbox struct {
	Mounts []HostMount
}

// HostMount is a volume of a HostSandbox and the filesystem mounted at its host path.
type HostMount struct {
	Mount
	FSType, Source string
}

// Start implements Runtime.
func (Host) Start(_ context.Context, _ *Pod, mounts []Mount) (Sandbox, error) {
	sb := &HostSandbox{}
	for _, m := range mounts {
		mi, ok, err := mountedAt(m.HostPath)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("volume for %s: nothing is mounted at %s on the host, the container would see an empty directory",
				m.ContainerPath, m.HostPath)
		}
		sb.Mounts = append(sb.Mounts, HostMount{Mount: m, FSType: mi.fsType, Source: mi.source})
	}
	return sb, nil
}

// Path returns where the container's path p is on the host, or "" when no volume holds it.
func (s *HostSandbox) Path(p string) string {
	for _, m := range s.Mounts {
		if rel, err := filepath.Rel(m.ContainerPath, p); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(m.HostPath, rel)
		}
	}
	return ""
}

// Stop implements Sandbox; there is nothing to stop.
func (s *HostSandbox) Stop(context.Context) error { return nil }

type mountInfo struct{ fsType, source string }

// mountedAt reports whether path is a mount point in this process's mount namespace (the last mount
// there, when several are stacked).
func mountedAt(path string) (mountInfo, bool, error) {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(filepath.Clean(path)))
	if err != nil || len(ms) == 0 {
		return mountInfo{}, false, err
	}
	last := ms[len(ms)-1]
	return mountInfo{fsType: last.FSType, source: last.Source}, true, nil
}

// --- crust-microvm ---

// MicroVM runs pods with crust-microvm, crust's reference microVM runtime handler: one VM per pod,
// `crust-microvm run --volume TARGET:CONTAINER_PATH...`, which claims each volume's descriptor from
// crustd and mounts it in the guest. It takes deferred volumes only.
type MicroVM struct {
	// Binary is the crust-microvm executable.
	Binary string
	// CrustSocket is crustd's socket.
	CrustSocket string
	// StateDir is crust-microvm's --state-dir; each run's log is kept there as <name>.log.
	StateDir string
	// Assets is the guest kernel and initramfs directory (--assets).
	Assets string
	// Accel is --accel (tcg, kvm or auto); crust-microvm's default when empty.
	Accel string
	// StartTimeout bounds Start (the VM's boot and the mounts in the guest); 2 minutes when zero.
	StartTimeout time.Duration
}

// MicroVMSandbox is a pod running in a crust-microvm VM.
type MicroVMSandbox struct {
	// Name is the sandbox's name (crust-microvm --name).
	Name string
	// Ready is how long the VM took from start to answering exec; Mounted until every volume was
	// mounted in the guest.
	Ready, Mounted time.Duration

	m       *MicroVM
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	waitErr error
}

// SandboxName is the crust-microvm name of a pod: its name, shortened, and the start of its UID.
func SandboxName(pod *Pod) string {
	name := regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(pod.Name, "-")
	if len(name) > 11 {
		name = name[:11]
	}
	uid := strings.ReplaceAll(pod.UID, "-", "")
	if len(uid) > 8 {
		uid = uid[:8]
	}
	if name == "" || !regexp.MustCompile(`^[A-Za-z0-9]`).MatchString(name) {
		name = "pod" + name
	}
	return name + "-" + uid
}

// Start implements Runtime: it boots the VM with the pod's volumes and waits until each is mounted in
// the guest at its container path.
func (m *MicroVM) Start(ctx context.Context, pod *Pod, mounts []Mount) (Sandbox, error) {
	timeout := m.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := os.MkdirAll(m.StateDir, 0o700); err != nil {
		return nil, err
	}
	s := &MicroVMSandbox{Name: SandboxName(pod), m: m, exited: make(chan struct{})}
	s.logPath = filepath.Join(m.StateDir, s.Name+".log")
	log, err := os.Create(s.logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	args := []string{"--state-dir", m.StateDir, "run", "--name", s.Name, "--crust-socket", m.CrustSocket, "--assets", m.Assets}
	if m.Accel != "" {
		args = append(args, "--accel", m.Accel)
	}
	for _, mt := range mounts {
		args = append(args, "--volume", mt.HostPath+":"+mt.ContainerPath)
	}
	s.cmd = exec.Command(m.Binary, args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	start := time.Now()
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
	fail := func(err error) (Sandbox, error) {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer scancel()
		_ = s.Stop(sctx)
		return nil, fmt.Errorf("crust-microvm %s: %w\n%s", s.Name, err, s.Log())
	}
	for {
		if _, _, code, err := s.Exec(ctx, "true"); err == nil && code == 0 {
			break
		}
		select {
		case <-s.exited:
			return fail(fmt.Errorf("run exited: %v", s.waitErr))
		case <-ctx.Done():
			return fail(fmt.Errorf("the VM did not answer within %s", timeout))
		case <-time.After(50 * time.Millisecond):
		}
	}
	s.Ready = time.Since(start)
	if len(mounts) > 0 {
		var script strings.Builder
		script.WriteString("i=0; for p in")
		for _, mt := range mounts {
			script.WriteString(" " + shellQuote(mt.ContainerPath))
		}
		script.WriteString(`; do while ! awk -v p="$p" '$2 == p {f=1} END {exit !f}' /proc/mounts; do ` +
			`i=$((i+1)); [ $i -gt 100000 ] && exit 1; usleep 10000; done; done`)
		stdout, stderr, code, err := s.Exec(ctx, "sh", "-c", script.String())
		if err != nil || code != 0 {
			return fail(fmt.Errorf("volumes not mounted in the guest (exit %d, %v): %s%s", code, err, stdout, stderr))
		}
	}
	s.Mounted = time.Since(start)
	return s, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Exec runs argv in the guest (crust-microvm exec) and returns its output and exit status; err is set
// only when crust-microvm could not be run.
func (s *MicroVMSandbox) Exec(ctx context.Context, argv ...string) (stdout, stderr string, code int, err error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, s.m.Binary, append([]string{"--state-dir", s.m.StateDir, "exec", s.Name, "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode(), nil
	}
	return out.String(), errb.String(), 0, err
}

// Log returns the run's log so far.
func (s *MicroVMSandbox) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// Console returns the guest's console output.
func (s *MicroVMSandbox) Console() string {
	b, _ := os.ReadFile(filepath.Join(s.m.StateDir, s.Name, "console.log"))
	return string(b)
}

// QEMUPid returns the pid of the VM's QEMU, or 0.
func (s *MicroVMSandbox) QEMUPid() int {
	b, err := os.ReadFile(filepath.Join(s.m.StateDir, s.Name, "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Stop implements Sandbox: crust-microvm stop, which unmounts and detaches the volumes, releases their
// claims and stops the VM; then the run process must exit 0.
func (s *MicroVMSandbox) Stop(ctx context.Context) error {
	select {
	case <-s.exited:
		return s.exitErr()
	default:
	}
	out, err := exec.CommandContext(ctx, s.m.Binary, "--state-dir", s.m.StateDir, "stop", s.Name).CombinedOutput()
	if err != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("crust-microvm stop %s: %v: %s", s.Name, err, out)
	}
	select {
	case <-s.exited:
		return s.exitErr()
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("crust-microvm run %s did not exit after stop", s.Name)
	}
}

func (s *MicroVMSandbox) exitErr() error {
	if s.waitErr != nil {
		return fmt.Errorf("crust-microvm run %s: %v", s.Name, s.waitErr)
	}
	return nil
}
