//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// process is a process started in a container. It leads its own process group (its own session with a
// terminal), which is how every process of the container is signalled.
type process struct {
	c      *container
	execID string
	pid    int

	done     chan struct{} // closed once it exited; status and exitedAt are set then
	status   int
	exitedAt time.Time

	stdout, stderr *stream // stderr is nil with a terminal

	inMu     sync.Mutex
	stdin    *os.File // the stdin pipe's write end, or the terminal; nil without either
	terminal *os.File // the terminal's controlling side, nil without a terminal
	inClosed bool
}

func (p *process) exited() bool { return isClosed(p.done) }

// killGroup signals the process's group; one that is gone is not an error.
func (p *process) killGroup(sig unix.Signal) {
	if err := unix.Kill(-p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		logger.Printf("container %s: signalling the group of %d: %v", p.c.id, p.pid, err)
	}
}

// closeIO closes stdin and the terminal and drops unread output.
func (p *process) closeIO() {
	p.inMu.Lock()
	if p.stdin != nil {
		_ = p.stdin.Close()
	}
	p.inClosed = true
	p.inMu.Unlock()
	for _, s := range []*stream{p.stdout, p.stderr} {
		if s != nil {
			s.discard()
		}
	}
}

// processIO is what the child gets as fds 0, 1, 2 and what the agent keeps.
type processIO struct {
	child    [3]*os.File
	stdin    *os.File
	terminal *os.File
	out, err *os.File // read ends (out is the terminal with one)
}

func (io *processIO) closeChild() {
	for i, f := range io.child {
		if f != nil && (i == 0 || f != io.child[i-1]) {
			_ = f.Close()
		}
	}
}

func (io *processIO) closeAll() {
	io.closeChild()
	for _, f := range []*os.File{io.stdin, io.terminal, io.out, io.err} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// openTerminal opens a new terminal of the container's devpts (its /dev/pts/ptmx), or of the guest's when
// the container has none, so that the process's tty is a path inside its root.
func openTerminal(root string) (ctl, peer *os.File, err error) {
	var fd int
	ptmx := filepath.Join(root, "dev/pts/ptmx")
	for _, path := range []string{ptmx, "/dev/ptmx"} {
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		if err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			_ = unix.Close(fd)
			continue
		}
		break
	}
	if err != nil {
		return nil, nil, fmt.Errorf("opening a terminal: %w", err)
	}
	ctl = os.NewFile(uintptr(fd), "ptmx")
	pfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		_ = ctl.Close()
		return nil, nil, fmt.Errorf("opening the terminal's peer: %w", errno)
	}
	return ctl, os.NewFile(pfd, "pts"), nil
}

func newProcessIO(root string, terminal, stdin bool) (*processIO, error) {
	pio := &processIO{}
	if terminal {
		ctl, peer, err := openTerminal(root)
		if err != nil {
			return nil, err
		}
		pio.child = [3]*os.File{peer, peer, peer}
		pio.terminal, pio.stdin, pio.out = ctl, ctl, ctl
		return pio, nil
	}
	var err error
	if stdin {
		if pio.child[0], pio.stdin, err = os.Pipe(); err != nil {
			return nil, err
		}
	} else if pio.child[0], err = os.Open(os.DevNull); err != nil {
		return nil, err
	}
	if pio.out, pio.child[1], err = os.Pipe(); err != nil {
		pio.closeAll()
		return nil, err
	}
	if pio.err, pio.child[2], err = os.Pipe(); err != nil {
		pio.closeAll()
		return nil, err
	}
	return pio, nil
}

func checkProcess(p *agentv1.Process) error {
	if p == nil || len(p.GetArgs()) == 0 || p.GetArgs()[0] == "" {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "process.args: empty")
	}
	if cwd := p.GetCwd(); cwd != "" && (!filepath.IsAbs(cwd) || filepath.Clean(cwd) != cwd) {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "process.cwd %q: not a clean absolute path", cwd)
	}
	for i, rl := range p.GetRlimits() {
		if _, ok := rlimits[rl.GetType()]; !ok {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "process.rlimits[%d].type %q: unknown", i, rl.GetType())
		}
		if rl.GetSoft() > rl.GetHard() {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "process.rlimits[%d]: soft above hard", i)
		}
	}
	return nil
}

// start starts a process in the container (see StartProcess) and answers its pid.
func (cs *containers) start(r *agentv1.StartProcessRequest) (int, error) {
	if err := checkProcess(r.GetProcess()); err != nil {
		return 0, err
	}
	c, err := cs.get(r.GetContainerId())
	if err != nil {
		return 0, err
	}
	execID := r.GetExecId()
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.procs[""]
	switch {
	case c.removing:
		return 0, agentproto.Errorf(errdefs.ErrFailedPrecondition, "container %s is being removed", c.id)
	case c.procs[execID] != nil:
		return 0, agentproto.Errorf(errdefs.ErrAlreadyExists, "exec_id: process %q of container %s was started already", execID, c.id)
	case execID != "" && (first == nil || first.exited()):
		return 0, agentproto.Errorf(errdefs.ErrFailedPrecondition, "exec_id %q: the first process of container %s does not run", execID, c.id)
	}
	p, err := cs.spawn(c, execID, r.GetProcess(), r.GetStdin())
	if err != nil {
		return 0, err
	}
	c.procs[execID] = p
	logger.Printf("container %s: process %q started, pid %d: %q", c.id, execID, p.pid, r.GetProcess().GetArgs())
	return p.pid, nil
}

// spawn forks the container init, hands it the spec and waits until it execs the process or fails.
func (cs *containers) spawn(c *container, execID string, proc *agentv1.Process, stdin bool) (*process, error) {
	spec, err := encodeSpec(c.root, proc)
	if err != nil {
		return nil, err
	}
	pio, err := newProcessIO(c.root, proc.GetTerminal(), stdin)
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		pio.closeAll()
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "init"), os.NewFile(uintptr(fds[1]), "init")
	defer func() { _ = ours.Close() }()
	sys := &syscall.SysProcAttr{Setpgid: true}
	if proc.GetTerminal() {
		sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	pid, ch, err := cs.procs.start("/proc/self/exe", []string{"crust-guest", ContainerInitArg}, &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{pio.child[0].Fd(), pio.child[1].Fd(), pio.child[2].Fd(), theirs.Fd()},
		Sys:   sys,
	})
	_ = theirs.Close()
	pio.closeChild()
	if err != nil {
		pio.closeAll()
		return nil, fmt.Errorf("starting the container init: %w", err)
	}
	_, werr := ours.Write(spec)
	if werr == nil {
		werr = unix.Shutdown(fds[0], unix.SHUT_WR)
	}
	answer, rerr := io.ReadAll(ours)
	if werr != nil || rerr != nil || len(answer) > 0 {
		pio.closeAll()
		ws := <-ch
		return nil, initError(answer, exitStatus(ws), errors.Join(werr, rerr))
	}
	p := &process{c: c, execID: execID, pid: pid, done: make(chan struct{}), stdin: pio.stdin, terminal: pio.terminal,
		stdout: newStream(pio.out)}
	if pio.err != nil {
		p.stderr = newStream(pio.err)
	}
	go func() {
		ws := <-ch
		p.status, p.exitedAt = exitStatus(ws), time.Now()
		close(p.done)
		logger.Printf("container %s: process %q (pid %d) exited with %d", c.id, execID, pid, p.status)
		if execID == "" {
			// As when a PID namespace's init exits: the container's other processes end with it.
			c.signalAll(unix.SIGKILL)
		}
	}()
	return p, nil
}

// signalAll signals the group of every process of the container.
func (c *container) signalAll(sig unix.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		p.killGroup(sig)
	}
}

// process returns the container's process execID names.
func (cs *containers) process(containerID, execID string) (*process, error) {
	c, err := cs.get(containerID)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[execID]; p != nil {
		return p, nil
	}
	return nil, agentproto.Errorf(errdefs.ErrNotFound, "exec_id: container %s has no process %q", containerID, execID)
}

func (cs *containers) signal(r *agentv1.SignalProcessRequest) error {
	sig := unix.Signal(r.GetSignal())
	if sig <= 0 || sig > 64 {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "signal %d: not a signal", r.GetSignal())
	}
	if r.GetAll() {
		c, err := cs.get(r.GetContainerId())
		if err != nil {
			return err
		}
		c.signalAll(sig)
		return nil
	}
	p, err := cs.process(r.GetContainerId(), r.GetExecId())
	if err != nil {
		return err
	}
	if p.exited() {
		return nil
	}
	if err := unix.Kill(p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signalling %d: %w", p.pid, err)
	}
	return nil
}

// maxRead bounds one ReadStream answer, well under ttrpc's message size.
const maxRead = 1 << 20

func (cs *containers) read(ctx context.Context, r *agentv1.ReadStreamRequest) (*agentv1.ReadStreamResponse, error) {
	p, err := cs.process(r.GetContainerId(), r.GetExecId())
	if err != nil {
		return nil, err
	}
	var s *stream
	switch r.GetStream() {
	case agentv1.Stream_STREAM_STDOUT:
		s = p.stdout
	case agentv1.Stream_STREAM_STDERR:
		if p.stderr == nil { // a terminal's output is all on stdout
			return &agentv1.ReadStreamResponse{Eof: true}, nil
		}
		s = p.stderr
	default:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "stream: %v is not STDOUT or STDERR", r.GetStream())
	}
	n := int(r.GetMaxBytes())
	if n == 0 {
		n = 32 << 10
	}
	data, eof, err := s.read(ctx, min(n, maxRead))
	if err != nil {
		return nil, err
	}
	return &agentv1.ReadStreamResponse{Data: data, Eof: eof}, nil
}

func (cs *containers) writeStdin(ctx context.Context, r *agentv1.WriteStdinRequest) error {
	p, err := cs.process(r.GetContainerId(), r.GetExecId())
	if err != nil {
		return err
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	switch {
	case p.stdin == nil:
		return agentproto.Errorf(errdefs.ErrFailedPrecondition, "process %q of container %s has no stdin (started without stdin)", r.GetExecId(), r.GetContainerId())
	case p.inClosed:
		return agentproto.Errorf(errdefs.ErrFailedPrecondition, "the stdin of process %q of container %s is closed", r.GetExecId(), r.GetContainerId())
	}
	dl, _ := ctx.Deadline() // zero: none
	_ = p.stdin.SetWriteDeadline(dl)
	if _, err := p.stdin.Write(r.GetData()); err != nil {
		return agentproto.Errorf(errdefs.ErrFailedPrecondition, "writing stdin: %v", err)
	}
	return nil
}

// veof is the terminal's end-of-file character (^D), which CloseStdin types on a terminal.
const veof = 0x04

func (cs *containers) closeStdin(r *agentv1.CloseStdinRequest) error {
	p, err := cs.process(r.GetContainerId(), r.GetExecId())
	if err != nil {
		return err
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.inClosed || p.stdin == nil {
		return nil
	}
	p.inClosed = true
	if p.terminal != nil {
		// Closing the terminal would hang it up: its reader gets end of file from ^D instead.
		_, err = p.terminal.Write([]byte{veof})
		return err
	}
	return p.stdin.Close()
}

func (cs *containers) resize(r *agentv1.ResizeTerminalRequest) error {
	p, err := cs.process(r.GetContainerId(), r.GetExecId())
	if err != nil {
		return err
	}
	if p.terminal == nil {
		return agentproto.Errorf(errdefs.ErrFailedPrecondition, "process %q of container %s has no terminal", r.GetExecId(), r.GetContainerId())
	}
	conn, err := p.terminal.SyscallConn()
	if err != nil {
		return err
	}
	ws := &unix.Winsize{Row: uint16(r.GetHeight()), Col: uint16(r.GetWidth())}
	if cerr := conn.Control(func(fd uintptr) { err = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) }); cerr != nil {
		return cerr
	}
	return err
}

func (cs *containers) wait(ctx context.Context, r *agentv1.WaitProcessRequest) (*agentv1.WaitProcessResponse, error) {
	p, err := cs.process(r.GetContainerId(), r.GetExecId())
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
		return &agentv1.WaitProcessResponse{ExitStatus: int32(p.status), ExitedAtUnixNanos: p.exitedAt.UnixNano()}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
