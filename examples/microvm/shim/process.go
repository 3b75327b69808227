package shim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/fifo"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// stdio are containerd's paths of a process's standard streams ("" when not wanted).
type stdio struct {
	stdin, stdout, stderr string
	terminal              bool
}

// process is a container's first process (exec "") or an exec'd one, in the guest.
type process struct {
	container, exec string
	io              stdio
	spec            *agentv1.Process

	mu       sync.Mutex
	started  bool
	guestPid int32
	stdinW   io.Closer // the stdin FIFO being copied, closed by CloseIO
	exited   chan struct{}
	status   uint32
	exitedAt time.Time
}

func newProcess(container, exec string, io stdio, spec *agentv1.Process) *process {
	return &process{container: container, exec: exec, io: io, spec: spec, exited: make(chan struct{})}
}

// exitStatus answers the status and time once exited.
func (p *process) exitStatus() (uint32, time.Time, bool) {
	select {
	case <-p.exited:
		return p.status, p.exitedAt, true
	default:
		return 0, time.Time{}, false
	}
}

// setExited records the exit, once.
func (p *process) setExited(status uint32, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	p.status, p.exitedAt = status, at
	close(p.exited)
}

// start opens the process's stdio, starts it in the guest, copies its streams until they end, and
// calls exited with its status once it has exited and its output is copied. The streams are opened
// before the process starts, so that no output is lost.
func (p *process) start(ctx context.Context, agent *agentproto.Client, log *slog.Logger, exited func(*process)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "process %s/%s already started", p.container, p.exec)
	}
	outs := map[agentv1.Stream]string{agentv1.Stream_STREAM_STDOUT: p.io.stdout}
	if !p.io.terminal {
		outs[agentv1.Stream_STREAM_STDERR] = p.io.stderr
	}
	var opened []io.Closer
	fail := func(err error) error {
		for _, w := range opened {
			_ = w.Close()
		}
		return err
	}
	type out struct {
		stream agentv1.Stream
		w      io.WriteCloser
	}
	var copies []out
	for stream, path := range outs {
		if path == "" {
			continue
		}
		w, err := openOutput(ctx, path)
		if err != nil {
			return fail(err)
		}
		opened = append(opened, w)
		copies = append(copies, out{stream, w})
	}
	var stdin io.ReadCloser
	if p.io.stdin != "" {
		r, err := openInput(ctx, p.io.stdin)
		if err != nil {
			return fail(err)
		}
		stdin = r
		opened = append(opened, r)
	}
	res, err := agent.StartProcess(ctx, &agentv1.StartProcessRequest{ContainerId: p.container, ExecId: p.exec,
		Process: p.spec, Stdin: stdin != nil})
	if err != nil {
		return fail(fmt.Errorf("starting the process in the guest: %w", err))
	}
	p.started, p.guestPid, p.stdinW = true, res.GetPid(), stdin
	log = log.With("container", p.container, "exec", p.exec, "guest_pid", res.GetPid())
	bg := context.WithoutCancel(ctx)
	var copied sync.WaitGroup
	for _, c := range copies {
		copied.Go(func() {
			defer func() { _ = c.w.Close() }()
			if err := p.copyOut(bg, agent, c.stream, c.w); err != nil {
				log.Warn("copying the process's output ended", "stream", c.stream.String(), "err", err)
			}
		})
	}
	if stdin != nil {
		go func() {
			if err := p.copyIn(bg, agent, stdin); err != nil {
				log.Warn("copying the process's input ended", "err", err)
			}
		}()
	}
	go func() {
		w, err := agent.WaitProcess(bg, &agentv1.WaitProcessRequest{ContainerId: p.container, ExecId: p.exec})
		status, at := uint32(w.GetExitStatus()), time.Unix(0, w.GetExitedAtUnixNanos())
		if err != nil { // the guest is gone: the process with it
			log.Error("waiting for the process in the guest failed; taking it for killed", "err", err)
			status, at = 128+uint32(syscall.SIGKILL), time.Now()
		}
		// The output the process wrote before it exited reaches containerd before its exit does; a stream
		// still held open by a process it left behind is not waited for long.
		done := make(chan struct{})
		go func() { copied.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		p.setExited(status, at)
		log.Info("process exited", "status", status)
		exited(p)
	}()
	return nil
}

// copyOut copies stream of the process from the guest to w until the stream ends.
func (p *process) copyOut(ctx context.Context, agent *agentproto.Client, stream agentv1.Stream, w io.Writer) error {
	for {
		r, err := agent.ReadStream(ctx, &agentv1.ReadStreamRequest{ContainerId: p.container, ExecId: p.exec, Stream: stream})
		if err != nil {
			return err
		}
		if len(r.GetData()) > 0 {
			if _, err := w.Write(r.GetData()); err != nil {
				return err
			}
		}
		if r.GetEof() {
			return nil
		}
	}
}

// copyIn copies r to the process's standard input until r ends, then closes it.
func (p *process) copyIn(ctx context.Context, agent *agentproto.Client, r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := agent.WriteStdin(ctx, &agentv1.WriteStdinRequest{ContainerId: p.container, ExecId: p.exec,
				Data: append([]byte(nil), buf[:n]...)}); werr != nil {
				return werr
			}
		}
		if err != nil {
			_, cerr := agent.CloseStdin(ctx, &agentv1.CloseStdinRequest{ContainerId: p.container, ExecId: p.exec})
			if err == io.EOF || isClosed(err) {
				return cerr
			}
			return err
		}
	}
}

func isClosed(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "file already closed") || strings.Contains(err.Error(), "use of closed"))
}

// closeStdin ends the copy of the standard input (CloseIO): the process reads end of file.
func (p *process) closeStdin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdinW != nil {
		_ = p.stdinW.Close()
		p.stdinW = nil
	}
}

// openOutput opens containerd's side of an output stream: a FIFO (containerd's reader is open by now);
// the binary:// and file:// forms of containerd's log drivers are not supported.
func openOutput(ctx context.Context, path string) (io.WriteCloser, error) {
	if err := checkFIFOPath(path); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
}

// openInput opens containerd's standard input FIFO, without waiting for its writer.
func openInput(ctx context.Context, path string) (io.ReadCloser, error) {
	if err := checkFIFOPath(path); err != nil {
		return nil, err
	}
	return fifo.OpenFifo(context.WithoutCancel(ctx), path, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
}

func checkFIFOPath(path string) error {
	if i := strings.Index(path, "://"); i >= 0 {
		return errdefs.Errorf(errdefs.ErrUnimplemented, "stdio %q: only FIFOs are supported, not %s URIs", path, path[:i])
	}
	return nil
}
