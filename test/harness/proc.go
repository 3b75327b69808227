package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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
	// Socket, StateDir, KataDir and KubeletDir are its --socket, --state-dir, --kata-dir and
	// --kubelet-dir; KubeletDir/pods exists.
	Socket, StateDir, KataDir, KubeletDir string
}

// StartCrustd starts bin (crustd) on new temp directories, with no HTTP listener and loop devices
// allowed, plus extra flags (a later flag wins), and waits until its health service is SERVING.
func StartCrustd(t testing.TB, bin string, extra ...string) *Crustd {
	t.Helper()
	// a directory of its own under a short one, so that a test may open it (and its parent) to other uids
	root := filepath.Join(SocketDir(t), "crustd")
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
		"--socket", d.Socket, "--state-dir", d.StateDir, "--kata-dir", d.KataDir, "--kubelet-dir", d.KubeletDir,
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
