package vmhandler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// The control socket (StateDir/NAME/control.sock, 0600) lets other processes reach a running sandbox; the
// guest agent's port takes one client, the run process. The run process serves crust.agent.v1's
// ControlService on it over ttrpc, with errors converted as on the agent's port (agentproto.ToGRPC,
// FromGRPC).

// ExecTimeout bounds a command run with Exec; its process group in the guest is killed then.
const ExecTimeout = 10 * time.Minute

// ErrNotRunning is returned (wrapped) by Exec for a sandbox that no run process serves.
var ErrNotRunning = errors.New("not running")

// control is the run process's side of the control socket.
type control struct {
	agent    atomic.Pointer[agentproto.Client] // nil until the VM is up
	stopReq  chan struct{}                     // closed by the first stop request
	stopOnce sync.Once
	finished chan struct{} // closed when Run is done; result is then set
	result   error
}

var _ agentv1.ControlServiceService = (*control)(nil)

func newControl() *control {
	return &control{stopReq: make(chan struct{}), finished: make(chan struct{})}
}

// finish records Run's outcome for the stop requests waiting on it.
func (c *control) finish(err error) {
	c.result = err
	close(c.finished)
}

func listenControl(path string) (net.Listener, error) { return unixsocket.Listen(path) }

// serve serves l until it is closed, and returns a function that waits (up to a bound) for the
// connections in progress to end, and then ends the server. A caller closes its connection once
// answered, so that is the wait for the answers to be written (ttrpc's own Shutdown may take a
// connection whose call is still running for an idle one).
func (c *control) serve(l net.Listener) (wait func(time.Duration)) {
	srv, err := agentproto.NewServer()
	if err != nil { // only for options it was not given
		panic(err)
	}
	agentv1.RegisterControlServiceService(srv, c)
	tl := &trackedListener{Listener: l}
	go func() { _ = srv.Serve(context.Background(), tl) }()
	return func(d time.Duration) {
		done := make(chan struct{})
		go func() { tl.conns.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(d):
		}
		_ = srv.Close()
	}
}

// trackedListener counts the connections it accepted that are not closed yet.
type trackedListener struct {
	net.Listener
	conns sync.WaitGroup
}

func (l *trackedListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.conns.Add(1)
	return &trackedConn{Conn: conn, done: l.conns.Done}, nil
}

type trackedConn struct {
	net.Conn
	once sync.Once
	done func()
}

func (c *trackedConn) Close() error {
	c.once.Do(c.done)
	return c.Conn.Close()
}

// upAgent returns the connection to the guest agent, unless the VM is not up yet or the sandbox is
// stopping.
func (c *control) upAgent() (*agentproto.Client, error) {
	agent := c.agent.Load()
	if agent == nil {
		return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "the VM is not up yet")
	}
	select {
	case <-c.stopReq:
		return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "the sandbox is stopping")
	default:
	}
	return agent, nil
}

// Exec runs the command in the guest, for at most ExecTimeout.
func (c *control) Exec(ctx context.Context, r *agentv1.ControlServiceExecRequest) (*agentv1.ControlServiceExecResponse, error) {
	agent, err := c.upAgent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ExecTimeout+30*time.Second)
	defer cancel()
	res, err := agent.Exec(ctx, &agentv1.ExecRequest{Argv: r.GetArgv(), TimeoutMillis: ExecTimeout.Milliseconds()})
	if err != nil {
		return nil, err
	}
	return &agentv1.ControlServiceExecResponse{Result: res}, nil
}

// Health passes the request on to the guest agent.
func (c *control) Health(ctx context.Context, r *agentv1.ControlServiceHealthRequest) (*agentv1.ControlServiceHealthResponse, error) {
	agent, err := c.upAgent()
	if err != nil {
		return nil, err
	}
	res, err := agent.Health(ctx, r.GetRequest())
	if err != nil {
		return nil, err
	}
	return &agentv1.ControlServiceHealthResponse{Result: res}, nil
}

// Stop asks Run to tear the sandbox down and answers once it is done.
func (c *control) Stop(ctx context.Context, _ *agentv1.StopRequest) (*agentv1.StopResponse, error) {
	c.stopOnce.Do(func() { close(c.stopReq) })
	select {
	case <-c.finished:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.result != nil {
		return &agentv1.StopResponse{TeardownError: c.result.Error()}, nil
	}
	return &agentv1.StopResponse{}, nil
}

// dial connects to the control socket of the run process of sandbox name.
func dial(ctx context.Context, stateDir, name string) (agentv1.ControlServiceService, func(), error) {
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", filepath.Join(stateDir, name, controlSocket))
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil, fmt.Errorf("sandbox %s: %w", name, ErrNotRunning)
	}
	if err != nil {
		return nil, nil, err
	}
	c := agentproto.NewClient(conn)
	return agentv1.NewControlServiceClient(c), func() { _ = c.Close() }, nil
}

// call makes one call (what) to the run process of sandbox name (whose state directory is under
// stateDir) on a connection of its own; a sandbox that is not running is ErrNotRunning, and an empty
// answer is an error.
func call[R any](ctx context.Context, stateDir, name, what string, do func(agentv1.ControlServiceService) (*R, error)) (*R, error) {
	ctl, closeConn, err := dial(ctx, stateDir, name)
	if err != nil {
		return nil, err
	}
	defer closeConn()
	res, err := do(ctl)
	switch {
	case err != nil:
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	case res == nil:
		return nil, fmt.Errorf("sandbox %s: empty answer to %s", name, what)
	}
	return res, nil
}

// Exec runs argv in the guest of the running sandbox name (whose state directory is under stateDir),
// through its run process, for at most ExecTimeout. An error answered by the guest agent carries its
// errdefs kind (a command not found is errdefs.ErrNotFound); a sandbox that is not running is
// ErrNotRunning.
func Exec(ctx context.Context, stateDir, name string, argv []string) (*agentv1.ExecResponse, error) {
	return call(ctx, stateDir, name, "exec", func(ctl agentv1.ControlServiceService) (*agentv1.ExecResponse, error) {
		resp, err := ctl.Exec(ctx, &agentv1.ControlServiceExecRequest{Argv: argv})
		return resp.GetResult(), err
	})
}

// Health asks the guest agent of the running sandbox name how it is, through its run process; with
// waitStarted it answers once the agent's start is over (its kernel modules loaded), which a caller timing
// mounts waits for first. A sandbox that is not running is ErrNotRunning; one whose VM is not up yet
// answers errdefs.ErrFailedPrecondition.
func Health(ctx context.Context, stateDir, name string, waitStarted bool) (*agentv1.HealthResponse, error) {
	return call(ctx, stateDir, name, "health", func(ctl agentv1.ControlServiceService) (*agentv1.HealthResponse, error) {
		resp, err := ctl.Health(ctx, &agentv1.ControlServiceHealthRequest{Request: &agentv1.HealthRequest{WaitStarted: waitStarted}})
		return resp.GetResult(), err
	})
}

// stop sends the stop request to the run process of sandbox name and returns its answer.
func stop(ctx context.Context, stateDir, name string) (*agentv1.StopResponse, error) {
	return call(ctx, stateDir, name, "stop", func(ctl agentv1.ControlServiceService) (*agentv1.StopResponse, error) {
		return ctl.Stop(ctx, &agentv1.StopRequest{})
	})
}

// Stop stops the sandbox name and returns once its run process has exited, with the teardown's error if
// it had one. A sandbox that is not running is not an error: the files a dead run left are cleaned (its
// claims in crustd stay, see the package documentation). One still booting is stopped as well.
func Stop(ctx context.Context, stateDir, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	dir, err := filepath.Abs(filepath.Join(stateDir, name))
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for {
		pid := lockHolder(dir)
		resp, err := stop(ctx, stateDir, name)
		if errors.Is(err, ErrNotRunning) {
			// Either dead (the lock is free: clean up after it) or starting, before its control socket.
			st, locked, lerr := tryLock(dir)
			if lerr != nil {
				return lerr
			}
			if locked {
				cleanStale(dir)
				st.unlock()
				return nil
			}
			if err := sleep(ctx, 50*time.Millisecond); err != nil {
				return fmt.Errorf("sandbox %s: %w", name, err)
			}
			continue
		}
		if err != nil {
			return err
		}
		// Answered: the teardown is over. Wait for the process to let the lock go, and then to exit.
		for {
			st, locked, lerr := tryLock(dir)
			if lerr != nil {
				return lerr
			}
			if locked {
				st.unlock()
				// (Run may be running in this very process, as a library.)
				if pid <= 0 || pid == os.Getpid() || !alive(pid) {
					break
				}
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return fmt.Errorf("sandbox %s: waiting for its process to exit: %w", name, err)
			}
		}
		if e := resp.GetTeardownError(); e != "" {
			return fmt.Errorf("sandbox %s: %s", name, e)
		}
		return nil
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
