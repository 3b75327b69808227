package agentproto

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// ErrClosed is returned by calls on a closed Client or one whose connection
// ended.
var ErrClosed = errors.New("agentproto: connection closed")

// Client is the host side of the protocol over one connection to the agent's
// port. Its methods are safe for concurrent use; calls are answered in any
// order.
type Client struct {
	conn io.ReadWriteCloser

	wmu sync.Mutex // serialises writes of whole lines

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan Response
	err     error // why the connection ended
	done    chan struct{}
}

// NewClient starts a Client on conn, which it owns from now on.
//
// Request ids start at a random value, so that a late answer to an earlier
// connection's request, still queued in the port, cannot be taken for an
// answer to this one's.
func NewClient(conn io.ReadWriteCloser) *Client {
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	c := &Client{
		conn:    conn,
		nextID:  binary.LittleEndian.Uint64(seed[:])>>2 + 1,
		pending: make(map[uint64]chan Response),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the connection; pending and later calls fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

func (c *Client) readLoop() {
	lr := NewLineReader(c.conn, MaxLineBytes)
	var err error
	for {
		var line []byte
		line, err = lr.ReadLine()
		if errors.Is(err, ErrLineTooLong) {
			continue
		}
		if err != nil {
			break
		}
		resp, derr := DecodeResponse(line)
		if derr != nil {
			continue // not ours to answer; the agent does not send anything else
		}
		c.mu.Lock()
		ch, ok := c.pending[resp.ID]
		delete(c.pending, resp.ID)
		c.mu.Unlock()
		if ok {
			ch <- resp
		}
	}
	_ = c.conn.Close()
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %v", ErrClosed, err)
	for id, ch := range c.pending {
		delete(c.pending, id)
		close(ch)
	}
	c.mu.Unlock()
	close(c.done)
}

type deadliner interface {
	SetWriteDeadline(time.Time) error
}

// Call sends op with args (nil for none) and decodes the result into result
// (nil to ignore it). An error answered by the agent is an *Error. When ctx
// ends first, Call returns ctx's error and a later answer is dropped.
func (c *Client) Call(ctx context.Context, op Op, args, result any) error {
	req := Request{Op: op}
	if args != nil {
		raw, err := json.Marshal(args)
		if err != nil {
			return fmt.Errorf("agentproto: %s args: %w", op, err)
		}
		req.Args = raw
	}
	ch := make(chan Response, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	req.ID = c.nextID
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	c.pending[req.ID] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
	}

	line, err := EncodeLine(req)
	if err != nil {
		forget()
		return err
	}
	if err := c.write(ctx, line); err != nil {
		forget()
		return err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return err
		}
		if resp.Error != nil {
			return resp.Error
		}
		if result != nil && len(resp.Result) > 0 {
			if err := json.Unmarshal(resp.Result, result); err != nil {
				return fmt.Errorf("agentproto: %s result: %w", op, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		return ctx.Err()
	}
}

func (c *Client) write(ctx context.Context, line []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if d, ok := c.conn.(deadliner); ok {
		deadline, _ := ctx.Deadline()
		_ = d.SetWriteDeadline(deadline)
	}
	if _, err := c.conn.Write(line); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return nil
}

// Ping asks the agent whether it is up.
func (c *Client) Ping(ctx context.Context) (PingResult, error) {
	var r PingResult
	err := c.Call(ctx, OpPing, nil, &r)
	return r, err
}

// Mount mounts a hot-plugged disk in the guest.
func (c *Client) Mount(ctx context.Context, args MountArgs) (MountResult, error) {
	var r MountResult
	err := c.Call(ctx, OpMount, args, &r)
	return r, err
}

// Unmount unmounts target in the guest.
func (c *Client) Unmount(ctx context.Context, target string) error {
	return c.Call(ctx, OpUnmount, UnmountArgs{Target: target}, nil)
}

// Statfs measures the filesystem mounted on target.
func (c *Client) Statfs(ctx context.Context, target string) (StatfsResult, error) {
	var r StatfsResult
	err := c.Call(ctx, OpStatfs, StatfsArgs{Target: target}, &r)
	return r, err
}

// Grow grows the filesystem mounted on target to its disk's size.
func (c *Client) Grow(ctx context.Context, args GrowArgs) (GrowResult, error) {
	var r GrowResult
	err := c.Call(ctx, OpGrow, args, &r)
	return r, err
}

// Exec runs a command in the guest.
func (c *Client) Exec(ctx context.Context, args ExecArgs) (ExecResult, error) {
	var r ExecResult
	err := c.Call(ctx, OpExec, args, &r)
	return r, err
}

// Shutdown asks the agent to unmount its volumes, sync and power off.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.Call(ctx, OpShutdown, nil, nil)
}
