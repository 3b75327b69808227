//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
)

// procTable starts the agent's child processes and, as PID 1's reaper,
// collects the exit status of every child: its own go to whoever started
// them, orphans that the kernel re-parented to PID 1 are just reaped.
type procTable struct {
	mu      sync.Mutex // held across fork and registration, and by the reaper while handing a status over
	waiters map[int]chan unix.WaitStatus
}

func newProcTable() *procTable {
	return &procTable{waiters: make(map[int]chan unix.WaitStatus)}
}

// reap runs forever, collecting exited children on SIGCHLD (and every
// second, in case a signal was coalesced with a status taken earlier).
func (p *procTable) reap() {
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, unix.SIGCHLD)
	tick := time.NewTicker(time.Second)
	for {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			p.mu.Lock()
			if ch, ok := p.waiters[pid]; ok {
				ch <- ws
				delete(p.waiters, pid)
			}
			p.mu.Unlock()
		}
		select {
		case <-sig:
		case <-tick.C:
		}
	}
}

// start forks and execs path with attr; the channel answers the child's wait status once the reaper
// collects it (the one way to learn it: PID 1 reaps every child).
func (p *procTable) start(path string, argv []string, attr *syscall.ProcAttr) (int, <-chan unix.WaitStatus, error) {
	ch := make(chan unix.WaitStatus, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	p.waiters[pid] = ch
	return pid, ch, nil
}

// runResult is what a finished command left.
type runResult struct {
	stdout, stderr []byte
	status         int // exit code, or 128+signal
	timedOut       bool
	truncated      bool
}

// run runs argv (argv[0] looked up in PATH) in its own process group with
// stdin on /dev/null, keeping up to agentproto.MaxExecOutput bytes of each of
// stdout and stderr. When timeout passes or ctx ends, the process group is
// killed. An error means the command could not be started.
func (p *procTable) run(ctx context.Context, argv []string, timeout time.Duration) (runResult, error) {
	return p.runInput(ctx, argv, timeout, nil)
}

// runInput is run with stdin reading input through a pipe (then its end), or /dev/null when input is nil.
func (p *procTable) runInput(ctx context.Context, argv []string, timeout time.Duration, input []byte) (runResult, error) {
	if len(argv) == 0 || argv[0] == "" {
		return runResult{}, agentproto.Errorf(errdefs.ErrInvalidArgument, "empty argv")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return runResult{}, agentproto.Errorf(errdefs.ErrNotFound, "%v", err)
	}
	var stdin, w *os.File
	if input == nil {
		stdin, err = os.Open(os.DevNull)
	} else if stdin, w, err = os.Pipe(); err == nil {
		go func() {
			_, _ = w.Write(input) // returns once read, or once the command exits and the read end closes
			_ = w.Close()
		}()
	}
	if err != nil {
		return runResult{}, err
	}
	defer func() { _ = stdin.Close() }()
	outR, outW, err := os.Pipe()
	if err != nil {
		return runResult{}, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return runResult{}, err
	}

	pid, ch, err := p.start(path, argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{stdin.Fd(), outW.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		return runResult{}, fmt.Errorf("starting %s: %v", argv[0], err)
	}

	var res runResult
	var outs [2]capture
	var wg sync.WaitGroup
	for i, r := range []*os.File{outR, errR} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i].readFrom(r)
		}()
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var ws unix.WaitStatus
	select {
	case ws = <-ch:
	case <-timer.C:
		res.timedOut = true
		_ = unix.Kill(-pid, unix.SIGKILL)
		ws = <-ch
	case <-ctx.Done():
		_ = unix.Kill(-pid, unix.SIGKILL)
		ws = <-ch
	}
	// Background children may keep the pipes open: give the output a moment
	// to drain, then stop reading.
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(200 * time.Millisecond):
	}
	_ = outR.Close()
	_ = errR.Close()
	<-drained

	res.stdout, res.stderr = outs[0].buf, outs[1].buf
	res.truncated = outs[0].truncated || outs[1].truncated
	res.status = exitStatus(ws)
	return res, nil
}

// exitStatus is the exit code, or 128+signal when a signal ended the process; -1 for neither.
func exitStatus(ws unix.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	default:
		return -1
	}
}

// capture keeps the first agentproto.MaxExecOutput bytes of a stream.
type capture struct {
	buf       []byte
	truncated bool
}

func (c *capture) readFrom(r io.Reader) {
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			room := agentproto.MaxExecOutput - len(c.buf)
			if n > room {
				c.truncated = true
				n = max(room, 0)
			}
			c.buf = append(c.buf, chunk[:n]...)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				logger.Printf("reading command output: %v", err)
			}
			return
		}
	}
}

// runTool runs a filesystem tool with a generous timeout and turns a failure
// into an error carrying its output.
func (p *procTable) runTool(ctx context.Context, argv ...string) (runResult, error) {
	return p.runToolInput(ctx, nil, argv...)
}

// runToolInput is runTool with input on the command's stdin (runInput).
func (p *procTable) runToolInput(ctx context.Context, input []byte, argv ...string) (runResult, error) {
	res, err := p.runInput(ctx, argv, 10*time.Minute, input)
	if err != nil {
		return res, err
	}
	if res.status != 0 {
		return res, fmt.Errorf("%s exited with %d: %s%s", argv[0], res.status, res.stderr, res.stdout)
	}
	return res, nil
}
