// Package harness is what crust's test tiers share: it starts crust's binaries (crustd, the CSI proxy,
// crust-microvm sandboxes) on temp directories and waits on their readiness (the gRPC health service, a
// CSI answer, exec reaching the guest agent) raced against the process's exit, so that a binary that
// crashes at start fails the test at once with its log; it waits on conditions with a bound (Poll,
// Eventually), never on a fixed time; and it makes kubelet-shaped target paths and the guest assets. The e2e tier runs the binaries on the host; the cluster tier runs
// crust-microvm inside the test node's mount namespace, through a command prefix (nsenter). It also
// holds the small pieces several tiers share (common.go): a root-only TestMain, a command that must
// succeed, a short temp directory for sockets, a gRPC server on a socket, a locked buffer.
package harness

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
	"sync"
	"syscall"
	"testing"
	"time"

	"crust.dev/crust/internal/testutil"
)

// ProcConfig says how to run one of crust's binaries.
type ProcConfig struct {
	// Bin is the binary; Args its arguments.
	Bin  string
	Args []string
	// LogFile receives the process's stdout and stderr (appended across restarts); empty makes one under
	// the test's temp directory.
	LogFile string
	// Ready waits until the started process is ready (WaitServing or WaitCSI on its socket); the
	// channel is closed when the process exits. Nil: ready once started.
	Ready func(ctx context.Context, exited <-chan struct{}) error
	// ReadyTimeout bounds Ready (a minute when zero), and so does the test's deadline.
	ReadyTimeout time.Duration
	// StopMustSucceed makes Stop fail the test unless the process exits 0 on SIGTERM.
	StopMustSucceed bool
}

// Proc is a binary the harness started. At cleanup a process still running is stopped, and on failure
// its log is shown. Its methods are for the test's goroutine, except Kill, which may race a request in
// flight (as a crash would).
type Proc struct {
	// ProcConfig is what the next Start runs: a test may change Args between a Stop and a Start.
	ProcConfig
	t       testing.TB
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// StartProc starts a binary and waits until it is ready; a process that exits first fails the test at
// once, with its log.
func StartProc(t testing.TB, cfg ProcConfig) *Proc {
	t.Helper()
	if cfg.LogFile == "" {
		cfg.LogFile = filepath.Join(t.TempDir(), filepath.Base(cfg.Bin)+".log")
	}
	p := &Proc{t: t, ProcConfig: cfg}
	t.Cleanup(func() {
		if p.Running() {
			p.Stop()
		}
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", p.Name(), Tail(p.Log(), 80))
		}
	})
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// ErrExited is the error of a Start whose process exited before it was ready.
var ErrExited = errors.New("exited at start")

// Name is the binary's base name.
func (p *Proc) Name() string { return filepath.Base(p.Bin) }

// Start starts the process again after Stop or Kill and waits until it is ready. An error says why it
// is not: it exited (with its log) or was not ready in time (it is then killed).
func (p *Proc) Start() error {
	if p.Running() {
		return fmt.Errorf("%s is running already", p.Name())
	}
	f, err := os.OpenFile(p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	from := p.logSize()
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.exited, p.waitErr = cmd, make(chan struct{}), nil
	go func(exited chan struct{}) { p.waitErr = cmd.Wait(); close(exited) }(p.exited)
	if p.Ready == nil {
		return nil
	}
	timeout := p.ReadyTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := Context(p.t, timeout)
	defer cancel()
	if err := p.Ready(ctx, p.exited); err != nil {
		select {
		case <-p.exited:
			return fmt.Errorf("%s %w (%v): %v\n%s", p.Name(), ErrExited, p.waitErr, err, p.Log()[from:])
		default:
		}
		p.Kill()
		return fmt.Errorf("%s not ready: %v\n%s", p.Name(), err, p.Log()[from:])
	}
	return nil
}

// Running reports whether the process was started and has not exited.
func (p *Proc) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Exited is closed when the process last started has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Pid is the process's pid.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// RSSKiB is the process's resident memory (VmRSS of /proc/PID/status), in KiB.
func (p *Proc) RSSKiB() (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.Pid())
}

// Kill ends the process with SIGKILL, as a crash would, and waits until it is gone. A process not
// running is left alone.
func (p *Proc) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Stop sends SIGTERM and waits until the process is gone: a process still there after 20 s is killed
// and fails the test, and so does an exit other than 0 when StopMustSucceed is set. A process not
// running is left alone.
func (p *Proc) Stop() {
	p.t.Helper()
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.waitErr != nil && p.StopMustSucceed {
			p.t.Errorf("%s exited with %v after SIGTERM", p.Name(), p.waitErr)
		}
	case <-time.After(20 * time.Second):
		p.Kill()
		p.t.Errorf("%s did not stop on SIGTERM in 20 s (killed)", p.Name())
	}
}

// Restart stops the process (SIGTERM) and starts it again, failing the test when it is not ready.
func (p *Proc) Restart() {
	p.t.Helper()
	p.Stop()
	if err := p.Start(); err != nil {
		p.t.Fatal(err)
	}
}

// Log is what the process (every start of it) logged so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

func (p *Proc) logSize() int {
	fi, err := os.Stat(p.LogFile)
	if err != nil {
		return 0
	}
	return int(fi.Size())
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// Build builds the named main packages of this module into dir, for tests that run the binaries.
func Build(dir string, pkgs ...string) error {
	root, err := FindModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// Crustd is a crustd process on temp directories.
type Crustd struct {
	*Proc
	// Root is the directory the others are made in (a test may put more there).
	Root string
	// Socket, StateDir, KataDir and KubeletDir are its --crust-socket, --state-dir, --kata-dir and
	// --kubelet-dir; KubeletDir/pods exists.
	Socket, StateDir, KataDir, KubeletDir string
}

// StartCrustd starts bin (crustd) on new temp directories, with no HTTP listener and loop devices
// allowed, plus extra flags (a later flag wins), and waits until its health service is SERVING.
func StartCrustd(t testing.TB, bin string, extra ...string) *Crustd {
	t.Helper()
	// a directory of its own under a short one, so that a test may open it (and its parent) to other uids
	root := filepath.Join(testutil.SocketDir(t), "crustd")
	d := &Crustd{
		Root:       root,
		Socket:     filepath.Join(root, "run", "crust.sock"),
		StateDir:   filepath.Join(root, "state"),
		KataDir:    filepath.Join(root, "kata"),
		KubeletDir: filepath.Join(root, "kubelet"),
	}
	if err := os.MkdirAll(filepath.Join(d.KubeletDir, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--crust-socket", d.Socket, "--state-dir", d.StateDir, "--kata-dir", d.KataDir, "--kubelet-dir", d.KubeletDir,
		"--http-addr", "", "--device-allow", "/dev/loop*",
	}, extra...)
	d.Proc = StartProc(t, ProcConfig{Bin: bin, Args: args, Ready: Serving(d.Socket)})
	return d
}

// PodTarget returns a kubelet-shaped publish target path of volume pv of pod under the kubelet
// directory, with the pod's directories made.
func (d *Crustd) PodTarget(t testing.TB, pod, pv string) string {
	t.Helper()
	return PodTarget(t, d.KubeletDir, pod, pv)
}

// PodTarget returns a kubelet-shaped publish target path of volume pv of pod under kubeletDir, with its
// parent made as kubelet would.
func PodTarget(t testing.TB, kubeletDir, pod, pv string) string {
	t.Helper()
	dir := filepath.Join(kubeletDir, "pods", pod, "volumes", "kubernetes.io~csi", pv)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "mount")
}

// MicroVMConfig says how to run one `crust-microvm run`.
type MicroVMConfig struct {
	// Bin is the crust-microvm binary.
	Bin string
	// Wrap is a command prefix every crust-microvm invocation runs under, such as
	// ["nsenter", "-t", PID, "-m", "--"]; empty runs it directly.
	Wrap []string
	// StateDir is crust-microvm's --state-dir.
	StateDir string
	// Name is the sandbox's name; SandboxID, when set, the id its volumes are claimed under.
	Name, SandboxID string
	// CrustSocket is crustd's socket as crust-microvm sees it.
	CrustSocket string
	// Assets is the guest assets directory (GuestAssets).
	Assets string
	// Volumes are TARGET:GUEST_PATH pairs.
	Volumes []string
}

// MicroVM is a `crust-microvm run` process.
type MicroVM struct {
	t   *testing.T
	cfg MicroVMConfig
	// Ready is the time from start to the first exec answered by the guest.
	Ready time.Duration
	// QemuPidWas is QEMU's pid when the sandbox became ready.
	QemuPidWas int
	cmd        *exec.Cmd
	logFile    string
	exited     chan struct{}
	waitErr    error
}

// StartMicroVM starts `crust-microvm run` (TCG) and waits until exec reaches its guest. At cleanup a run
// still going is stopped, and on failure its log and the guest console are shown.
func StartMicroVM(t *testing.T, cfg MicroVMConfig) *MicroVM {
	t.Helper()
	m := &MicroVM{t: t, cfg: cfg, exited: make(chan struct{})}
	f, err := os.CreateTemp(t.TempDir(), "crust-microvm-*.log")
	if err != nil {
		t.Fatal(err)
	}
	m.logFile = f.Name()
	args := []string{"--state-dir", cfg.StateDir, "run", "--name", cfg.Name, "--crust-socket", cfg.CrustSocket, "--accel", "tcg", "--assets", cfg.Assets}
	if cfg.SandboxID != "" {
		args = append(args, "--sandbox-id", cfg.SandboxID)
	}
	for _, v := range cfg.Volumes {
		args = append(args, "--volume", v)
	}
	m.cmd = m.command(args...)
	m.cmd.Stdout, m.cmd.Stderr = f, f
	start := time.Now()
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	go func() { m.waitErr = m.cmd.Wait(); close(m.exited) }()
	t.Cleanup(func() {
		select {
		case <-m.exited:
		default:
			_, _, _ = m.run("--state-dir", cfg.StateDir, "stop", cfg.Name)
			select {
			case <-m.exited:
			case <-time.After(30 * time.Second):
				_ = m.cmd.Process.Kill()
				<-m.exited
			}
		}
		if t.Failed() {
			t.Logf("crust-microvm log:\n%s", m.Log())
			if b, err := m.readState("console.log"); err == nil {
				t.Logf("guest console:\n%s", b)
			}
		}
	})
	ctx, cancel := Context(t, 2*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-m.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := Poll(ctx, func() (bool, error) {
		_, _, code := m.Exec("true")
		return code == 0, nil
	}); err != nil {
		select {
		case <-m.exited:
			t.Fatalf("crust-microvm exited: %v\n%s", m.waitErr, m.Log())
		default:
		}
		t.Fatalf("crust-microvm not ready after %s: %v\n%s", time.Since(start).Round(time.Second), err, m.Log())
	}
	m.Ready = time.Since(start).Round(time.Millisecond)
	m.QemuPidWas = m.QemuPid()
	return m
}

// command is crust-microvm with args, under the configured prefix.
func (m *MicroVM) command(args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, m.cfg.Wrap...), m.cfg.Bin), args...)
	return exec.Command(argv[0], argv[1:]...)
}

// run runs crust-microvm with args and returns its stdout, stderr and exit status.
func (m *MicroVM) run(args ...string) (string, string, int) {
	var stdout, stderr bytes.Buffer
	cmd := m.command(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		m.t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	return stdout.String(), stderr.String(), code
}

// readState reads a file of the sandbox's state directory, through the prefix's mount namespace.
func (m *MicroVM) readState(name string) ([]byte, error) {
	p := filepath.Join(m.cfg.StateDir, m.cfg.Name, name)
	if len(m.cfg.Wrap) == 0 {
		return os.ReadFile(p)
	}
	argv := append(append([]string{}, m.cfg.Wrap...), "cat", p)
	return exec.Command(argv[0], argv[1:]...).Output()
}

// Log is what the run process logged so far.
func (m *MicroVM) Log() string {
	b, _ := os.ReadFile(m.logFile)
	return string(b)
}

// LogValue returns the value of key on the last log line with msg that contains every one of has.
func (m *MicroVM) LogValue(msg, key string, has ...string) string {
	return LogValue(m.Log(), msg, key, has...)
}

// WaitLogValue is LogValue once such a line is there (the guest may show a mount a moment before the
// handler logs it), or "" after a few seconds.
func (m *MicroVM) WaitLogValue(msg, key string, has ...string) string {
	return WaitLogFileValue(m.logFile, msg, key, has...)
}

// LogValue returns the value of key on the last line of a text (slog) log with msg that contains every
// one of has; "" when there is none.
func LogValue(log, msg, key string, has ...string) string {
	lines := strings.Split(log, "\n")
	re := regexp.MustCompile(`(?:^| )` + regexp.QuoteMeta(key) + `=("(?:[^"\\]|\\.)*"|\S*)`)
next:
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if !strings.Contains(l, "msg="+strconv.Quote(msg)) && !strings.Contains(l, "msg="+msg+" ") {
			continue
		}
		for _, h := range has {
			if !strings.Contains(l, h) {
				continue next
			}
		}
		if sm := re.FindStringSubmatch(l); sm != nil {
			if s, err := strconv.Unquote(sm[1]); err == nil {
				return s
			}
			return sm[1]
		}
	}
	return ""
}

// WaitLogFileValue is LogValue of the log file at path once such a line is there, or "" after a few
// seconds.
func WaitLogFileValue(path, msg, key string, has ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var v string
	_ = Poll(ctx, func() (bool, error) {
		b, _ := os.ReadFile(path)
		v = LogValue(string(b), msg, key, has...)
		return v != "", nil
	})
	return v
}

// Exec runs `crust-microvm exec NAME -- argv...` and returns its stdout, stderr and exit status.
func (m *MicroVM) Exec(argv ...string) (string, string, int) {
	m.t.Helper()
	return m.run(append([]string{"--state-dir", m.cfg.StateDir, "exec", m.cfg.Name, "--"}, argv...)...)
}

// ExecOK is Exec that fails the test unless the command exits 0; it returns the trimmed stdout.
func (m *MicroVM) ExecOK(argv ...string) string {
	m.t.Helper()
	out, errOut, code := m.Exec(argv...)
	if code != 0 {
		m.t.Fatalf("exec %q: exit %d: %s%s", argv, code, out, errOut)
	}
	return strings.TrimSpace(out)
}

// WaitMountedAsync waits, in the guest, until something is mounted on path (at most a minute).
func (m *MicroVM) WaitMountedAsync(path string) <-chan error {
	ch := make(chan error, 1)
	script := fmt.Sprintf(`i=0; while ! awk '$2 == %q {f=1} END {exit !f}' /proc/mounts; do i=$((i+1)); [ $i -gt 6000 ] && exit 1; usleep 10000; done`, path)
	cmd := m.command("--state-dir", m.cfg.StateDir, "exec", m.cfg.Name, "--", "sh", "-c", script)
	go func() {
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%s not mounted: %v: %s", path, err, out)
		}
		ch <- err
	}()
	return ch
}

// QemuPid is the pid of the sandbox's QEMU.
func (m *MicroVM) QemuPid() int {
	m.t.Helper()
	b, err := m.readState("qemu.pid")
	if err != nil {
		m.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		m.t.Fatal(err)
	}
	return pid
}

// Kill ends the run process with SIGKILL, as a crash would.
func (m *MicroVM) Kill() {
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
}

// Stop runs `crust-microvm stop NAME`, which must return only once the run process is gone, and checks
// that the run process exited 0.
func (m *MicroVM) Stop() {
	m.t.Helper()
	t0 := time.Now()
	_, errOut, code := m.run("--state-dir", m.cfg.StateDir, "stop", m.cfg.Name)
	if code != 0 {
		m.t.Fatalf("stop: exit %d: %s", code, errOut)
	}
	m.t.Logf("stop (unmount, detach, release, VM down): %s", time.Since(t0).Round(time.Millisecond))
	if ProcessAlive(m.cmd.Process.Pid) {
		m.t.Errorf("crust-microvm run still running after stop returned")
	}
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		m.t.Fatal("crust-microvm run did not exit")
	}
	if m.waitErr != nil {
		m.t.Errorf("crust-microvm run exited with %v:\n%s", m.waitErr, m.Log())
	}
}

// ExitCode waits for the run process to exit and returns its exit status (-1 when a signal ended it).
func (m *MicroVM) ExitCode() int {
	<-m.exited
	return m.cmd.ProcessState.ExitCode()
}

// Exited is closed when the run process has exited.
func (m *MicroVM) Exited() <-chan struct{} { return m.exited }

// ProcessesNaming lists the live processes but this one whose command line contains s, each as its pid,
// a colon and its command line.
func ProcessesNaming(s string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), s) {
			continue
		}
		if pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p))); ProcessAlive(pid) && pid != os.Getpid() {
			found = append(found, fmt.Sprintf("%d: %s", pid, strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")))
		}
	}
	return found
}

// ProcessAlive reports whether pid is a process that has not exited (a zombie has).
func ProcessAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// GuestAssets returns an assets directory for crust-microvm --assets: the guest kernel (fetched with
// hack/guest/fetch-kernel.sh into CRUST_GUEST_ASSETS or _output/guest when missing) and an initramfs built
// with examples/microvm/hack/mkinitramfs from this tree's crust-guest, once per test binary, under dir. It skips the
// test only when the kernel cannot be fetched; a missing QEMU fails it.
func GuestAssets(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu-system-x86_64 is missing: apt-get install qemu-system-x86 (make deps)")
	}
	assetsOnce.Do(func() { assetsDir, assetsSkip, assetsErr = buildGuestAssets(t, filepath.Join(dir, "guest")) })
	if assetsSkip != "" {
		t.Skip(assetsSkip)
	}
	if assetsErr != nil {
		t.Fatal(assetsErr)
	}
	return assetsDir
}

var (
	assetsOnce            sync.Once
	assetsDir, assetsSkip string
	assetsErr             error
)

func buildGuestAssets(t *testing.T, dir string) (string, string, error) {
	root := ModuleRoot(t)
	src := os.Getenv("CRUST_GUEST_ASSETS")
	if src == "" {
		src = filepath.Join(root, "_output", "guest")
	}
	t0 := time.Now()
	// The kernel is what fetch-kernel.sh brings; mkinitramfs checks the rest of what it brings.
	if _, err := os.Stat(filepath.Join(src, "cloud", "vmlinux")); err != nil {
		cmd := exec.Command(filepath.Join(root, "hack", "guest", "fetch-kernel.sh"), src)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Sprintf("skipping: the guest kernel cannot be fetched (%v):\n%s", err, out), nil
		}
		t.Logf("fetched the guest kernel into %s in %s", src, time.Since(t0).Round(time.Second))
	}
	agent := filepath.Join(dir, "crust-guest")
	build := exec.Command("go", "build", "-o", agent, "crust.dev/crust/examples/microvm/cmd/crust-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	mkrd := exec.Command("go", "run", "./examples/microvm/hack/mkinitramfs", "-assets", src, "-flavour", "cloud",
		"-agent", agent, "-o", filepath.Join(dir, "initramfs-cloud.cpio"))
	for _, c := range []*exec.Cmd{build, mkrd} {
		c.Dir = root
		if out, err := c.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("%s: %v\n%s", strings.Join(c.Args, " "), err, out)
		}
	}
	if err := os.Symlink(filepath.Join(src, "cloud"), filepath.Join(dir, "cloud")); err != nil {
		return "", "", err
	}
	t.Logf("guest assets ready in %s", time.Since(t0).Round(time.Millisecond))
	return dir, "", nil
}

// ModuleRoot is the root of crust's repository: the directory of the go.work (which ties its Go modules)
// above the working directory. It fails t when there is none.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := FindModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// FindModuleRoot is ModuleRoot for code that has no testing.TB (a TestMain).
func FindModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for ; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("no go.work above the working directory")
}
