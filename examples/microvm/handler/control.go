package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/pkg/unixsocket"
)

// The control socket (StateDir/NAME/control.sock, 0600) lets other processes reach a running sandbox; the
// guest agent's port takes one client, the run process. Protocol: one JSON request per connection, one
// JSON response, then the run process closes the connection.
//
//	{"op": "exec", "argv": ["ls", "-l"]}  ->  {"exec": {agentproto.ExecResult}} or {"error": {agentproto.Error}}
//	{"op": "stop"}                        ->  {} once the sandbox is torn down, or {"error": ...}

// ExecTimeout bounds a command run with Exec; its process group in the guest is killed then.
const ExecTimeout = 10 * time.Minute

// ErrNotRunning is returned (wrapped) by Exec for a sandbox that no run process serves.
var ErrNotRunning = errors.New("not running")

type controlRequest struct {
	Op   string   `json:"op"`
	Argv []string `json:"argv,omitempty"`
}

type controlResponse struct {
	Exec  *agentproto.ExecResult `json:"exec,omitempty"`
	Error *agentproto.Error      `json:"error,omitempty"`
}

// control is the run process's side of the control socket.
type control struct {
	agent    atomic.Pointer[agentproto.Client] // nil until the VM is up
	stopReq  chan struct{}                     // closed by the first stop request
	stopOnce sync.Once
	finished chan struct{} // closed when Run is done; result is then set
	result   error
}

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
// connections in progress to be answered.
func (c *control) serve(l net.Listener) (wait func(time.Duration)) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { c.handle(conn) })
		}
	})
	return func(d time.Duration) {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(d):
		}
	}
}

func (c *control) handle(conn net.Conn) {
	defer func() { _ = conn.Close() }()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var req controlRequest
	var resp controlResponse
	if err := json.NewDecoder(conn).Decode(&req); err != nil {
		resp.Error = agentproto.Errorf(agentproto.CodeInvalidArgument, "control request: %v", err)
	} else {
		resp = c.do(req)
	}
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_ = json.NewEncoder(conn).Encode(resp)
}

func (c *control) do(req controlRequest) controlResponse {
	switch req.Op {
	case "exec":
		agent := c.agent.Load()
		if agent == nil {
			return controlResponse{Error: agentproto.Errorf(agentproto.CodeFailedPrecondition, "the VM is not up yet")}
		}
		select {
		case <-c.stopReq:
			return controlResponse{Error: agentproto.Errorf(agentproto.CodeFailedPrecondition, "the sandbox is stopping")}
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), ExecTimeout+30*time.Second)
		defer cancel()
		res, err := agent.Exec(ctx, agentproto.ExecArgs{Argv: req.Argv, TimeoutMillis: ExecTimeout.Milliseconds()})
		if err != nil {
			var ae *agentproto.Error
			if !errors.As(err, &ae) {
				ae = agentproto.Errorf(agentproto.CodeInternal, "%v", err)
			}
			return controlResponse{Error: ae}
		}
		return controlResponse{Exec: &res}
	case "stop":
		c.stopOnce.Do(func() { close(c.stopReq) })
		<-c.finished
		if c.result != nil {
			return controlResponse{Error: agentproto.Errorf(agentproto.CodeInternal, "%v", c.result)}
		}
		return controlResponse{}
	}
	return controlResponse{Error: agentproto.Errorf(agentproto.CodeInvalidArgument, "unknown op %q", req.Op)}
}

// call sends one request to the run process of sandbox name and returns its answer.
func call(ctx context.Context, stateDir, name string, req controlRequest) (controlResponse, error) {
	if err := checkName(name); err != nil {
		return controlResponse{}, err
	}
	path := filepath.Join(stateDir, name, controlSocket)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return controlResponse{}, fmt.Errorf("sandbox %s: %w", name, ErrNotRunning)
	}
	if err != nil {
		return controlResponse{}, err
	}
	defer func() { _ = conn.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return controlResponse{}, fmt.Errorf("sandbox %s: %w", name, err)
	}
	var resp controlResponse
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil {
			return controlResponse{}, ctx.Err()
		}
		return controlResponse{}, fmt.Errorf("sandbox %s: no answer: %w", name, err)
	}
	return resp, nil
}

// Exec runs argv in the guest of the running sandbox name (whose state directory is under stateDir),
// through its run process, for at most ExecTimeout. An error answered by the guest agent (a command not
// found, say) is an *agentproto.Error; a sandbox that is not running is ErrNotRunning.
func Exec(ctx context.Context, stateDir, name string, argv []string) (agentproto.ExecResult, error) {
	resp, err := call(ctx, stateDir, name, controlRequest{Op: "exec", Argv: argv})
	switch {
	case err != nil:
		return agentproto.ExecResult{}, err
	case resp.Error != nil:
		return agentproto.ExecResult{}, resp.Error
	case resp.Exec == nil:
		return agentproto.ExecResult{}, fmt.Errorf("sandbox %s: empty answer to exec", name)
	}
	return *resp.Exec, nil
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
		resp, err := call(ctx, stateDir, name, controlRequest{Op: "stop"})
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
		if resp.Error != nil {
			return fmt.Errorf("sandbox %s: %s", name, resp.Error.Message)
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
