package agentproto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// fakeAgent answers like the agent: Exec echoes argv (argv[0] "block" waits until its argv[1] is
// released; "fail" fails with the kind named by argv[1]); Statfs echoes its target as the message. The
// container calls are not exercised here: the embedded nil interface leaves them unimplemented.
type fakeAgent struct {
	agentv1.AgentServiceService
	mu      sync.Mutex
	release map[string]chan struct{}
	started chan string
}

func newFakeAgent() *fakeAgent {
	return &fakeAgent{release: map[string]chan struct{}{}, started: make(chan string, 64)}
}

func (a *fakeAgent) gate(name string) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.release[name] == nil {
		a.release[name] = make(chan struct{})
	}
	return a.release[name]
}

var testKinds = map[string]error{
	"invalid":   errdefs.ErrInvalidArgument,
	"notfound":  errdefs.ErrNotFound,
	"failed":    errdefs.ErrFailedPrecondition,
	"unimpl":    errdefs.ErrUnimplemented,
	"deadline":  context.DeadlineExceeded,
	"exhausted": errdefs.ErrResourceExhausted,
}

func (a *fakeAgent) Exec(ctx context.Context, r *agentv1.ExecRequest) (*agentv1.ExecResponse, error) {
	argv := r.GetArgv()
	switch {
	case len(argv) == 2 && argv[0] == "block":
		a.started <- argv[1]
		select {
		case <-a.gate(argv[1]):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case len(argv) == 2 && argv[0] == "fail":
		if k := testKinds[argv[1]]; k != nil {
			return nil, Errorf(k, "failing with %s", argv[1])
		}
		return nil, fmt.Errorf("failing with no kind")
	}
	return &agentv1.ExecResponse{Stdout: []byte(strings.Join(argv, " ")), ExitStatus: int32(len(argv))}, nil
}

func (a *fakeAgent) Health(context.Context, *agentv1.HealthRequest) (*agentv1.HealthResponse, error) {
	return &agentv1.HealthResponse{Version: "test", Kernel: "6.1-test"}, nil
}

func (a *fakeAgent) Mount(_ context.Context, r *agentv1.MountRequest) (*agentv1.MountResponse, error) {
	return &agentv1.MountResponse{Device: "/dev/" + r.GetSerial()}, nil
}

func (a *fakeAgent) Unmount(context.Context, *agentv1.UnmountRequest) (*agentv1.UnmountResponse, error) {
	return &agentv1.UnmountResponse{}, nil
}

func (a *fakeAgent) Statfs(_ context.Context, r *agentv1.StatfsRequest) (*agentv1.StatfsResponse, error) {
	return &agentv1.StatfsResponse{Message: r.GetTarget(), Bytes: &agentv1.Usage{Total: 1 << 30}}, nil
}

func (a *fakeAgent) Grow(context.Context, *agentv1.GrowRequest) (*agentv1.GrowResponse, error) {
	return &agentv1.GrowResponse{}, nil
}

func (a *fakeAgent) Shutdown(context.Context, *agentv1.ShutdownRequest) (*agentv1.ShutdownResponse, error) {
	return &agentv1.ShutdownResponse{}, nil
}

// bridge stands in for QEMU: a unix socket (the chardev) for one host connection at a time (the next is
// accepted once the one before has gone and what it wrote has been passed on), and the
// guest's end of the port. Like QEMU it keeps what the guest wrote while no host was connected, or what
// a host that went away did not read, for the next host; and it passes on whatever a host wrote before
// it went, so that half a frame may be left in the port in either direction.
type bridge struct {
	path  string
	guest net.Conn // the bridge's end; the agent has the other

	mu     sync.Mutex
	cond   *sync.Cond
	host   net.Conn // the host connected now, nil between hosts
	gen    int      // counts host connections
	closed bool

	// dropHost, while set, drops what hosts write (a guest that has not opened its port yet).
	dropHost   bool
	hostWrites int // counts hosts' writes that were passed on or dropped
}

func newBridge(t *testing.T) (*bridge, io.ReadWriteCloser) {
	t.Helper()
	b := &bridge{path: filepath.Join(t.TempDir(), "agent.sock")}
	b.cond = sync.NewCond(&b.mu)
	ln, err := net.Listen("unix", b.path)
	if err != nil {
		t.Fatal(err)
	}
	var agentEnd net.Conn
	b.guest, agentEnd = net.Pipe()
	t.Cleanup(func() {
		_ = ln.Close()
		_ = b.guest.Close()
		b.mu.Lock()
		b.closed = true
		if b.host != nil {
			_ = b.host.Close()
		}
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			b.connected(c)
			b.fromHost(c) // one host at a time, as QEMU: the next is accepted when this one is gone
		}
	}()
	go b.toHost()
	return b, agentEnd
}

func (b *bridge) connected(c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.host, b.gen = c, b.gen+1
	b.cond.Broadcast()
}

func (b *bridge) fromHost(c net.Conn) {
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			b.mu.Lock()
			drop := b.dropHost
			b.hostWrites++
			b.cond.Broadcast()
			b.mu.Unlock()
			if !drop {
				if _, werr := b.guest.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			b.mu.Lock()
			if b.host == c {
				b.host = nil
			}
			b.mu.Unlock()
			return
		}
	}
}

func (b *bridge) toHost() {
	buf := make([]byte, 64<<10)
	for {
		n, err := b.guest.Read(buf)
		if err != nil {
			return
		}
		for {
			b.mu.Lock()
			for b.host == nil && !b.closed {
				b.cond.Wait()
			}
			h := b.host
			b.mu.Unlock()
			if h == nil {
				return
			}
			if _, err := h.Write(buf[:n]); err == nil {
				break
			}
			b.mu.Lock()
			if b.host == h {
				b.host = nil
			}
			b.mu.Unlock()
		}
	}
}

// rawHost connects to the bridge as a host that speaks no protocol, and waits until the bridge has it.
func (b *bridge) rawHost(t *testing.T) net.Conn {
	t.Helper()
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	c, err := net.Dial("unix", b.path)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	for b.gen == gen {
		b.cond.Wait()
	}
	b.mu.Unlock()
	return c
}

// serveAgent serves a fakeAgent on the agent's end of the bridge.
func serveAgent(t *testing.T, port io.ReadWriteCloser) *fakeAgent {
	t.Helper()
	l := ListenPort(port)
	srv, err := NewServer()
	if err != nil {
		t.Fatal(err)
	}
	a := newFakeAgent()
	agentv1.RegisterAgentServiceService(srv, a)
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return a
}

func dial(t *testing.T, b *bridge) *Client {
	t.Helper()
	c, err := Dial(t.Context(), b.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestCallRoundTrip(t *testing.T) {
	b, port := newBridge(t)
	serveAgent(t, port)
	c := dial(t, b)
	ctx := t.Context()
	h, err := c.Health(ctx, &agentv1.HealthRequest{})
	if err != nil || h.GetKernel() != "6.1-test" || h.GetVersion() != "test" {
		t.Fatalf("Health = %v, %v", h, err)
	}
	m, err := c.Mount(ctx, &agentv1.MountRequest{Serial: "vol-1", Target: "/v"})
	if err != nil || m.GetDevice() != "/dev/vol-1" {
		t.Fatalf("Mount = %v, %v", m, err)
	}
	// A payload far over one frame comes back whole.
	long := strings.Repeat("x", 3*maxPayload+17)
	st, err := c.Statfs(ctx, &agentv1.StatfsRequest{Target: long})
	if err != nil || st.GetMessage() != long || st.GetBytes().GetTotal() != 1<<30 {
		t.Fatalf("Statfs: %d bytes back, %v", len(st.GetMessage()), err)
	}
}

func TestConcurrentCallsOutOfOrder(t *testing.T) {
	b, port := newBridge(t)
	a := serveAgent(t, port)
	c := dial(t, b)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprint(i)
			res, err := c.Exec(t.Context(), &agentv1.ExecRequest{Argv: []string{"block", name}})
			if err == nil && string(res.GetStdout()) != "block "+name {
				err = fmt.Errorf("call %d got %q", i, res.GetStdout())
			}
			errs[i] = err
		})
	}
	for range n {
		<-a.started // all n are in the agent at once
	}
	for i := n - 1; i >= 0; i-- { // answered last first
		close(a.gate(fmt.Sprint(i)))
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func TestCallContextAndLateAnswer(t *testing.T) {
	b, port := newBridge(t)
	a := serveAgent(t, port)
	c := dial(t, b)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"block", "late"}})
		done <- err
	}()
	<-a.started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	close(a.gate("late")) // its answer, if any, must not be taken for the next call's
	res, err := c.Exec(t.Context(), &agentv1.ExecRequest{Argv: []string{"next"}})
	if err != nil || string(res.GetStdout()) != "next" {
		t.Fatalf("next call = %q, %v", res.GetStdout(), err)
	}
}

func TestClosedConnection(t *testing.T) {
	b, port := newBridge(t)
	a := serveAgent(t, port)
	c := dial(t, b)
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(t.Context(), &agentv1.ExecRequest{Argv: []string{"block", "pending"}})
		done <- err
	}()
	<-a.started
	_ = c.Close()
	if err := <-done; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("pending call on a closed client: %v, want ErrUnavailable", err)
	}
	<-c.Done()
	if _, err := c.Health(t.Context(), &agentv1.HealthRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("call on a closed client: %v, want ErrUnavailable", err)
	}
}

// TestErrorsCrossTheWire: each kind reaches the host as itself with the agent's message, and an error
// of no kind as one of no kind.
func TestErrorsCrossTheWire(t *testing.T) {
	b, port := newBridge(t)
	serveAgent(t, port)
	c := dial(t, b)
	for name, kind := range testKinds {
		_, err := c.Exec(t.Context(), &agentv1.ExecRequest{Argv: []string{"fail", name}})
		if !errors.Is(err, kind) || err.Error() != "failing with "+name {
			t.Errorf("%s: got %v, want %v with the agent's message", name, err, kind)
		}
		if st, _ := status.FromError(ToGRPC(err)); st.Message() != "failing with "+name {
			t.Errorf("%s: passed on as %v", name, st)
		}
	}
	_, err := c.Exec(t.Context(), &agentv1.ExecRequest{Argv: []string{"fail", "none"}})
	for name, kind := range testKinds {
		if errors.Is(err, kind) {
			t.Errorf("an error of no kind arrived as %s", name)
		}
	}
	if status.Code(ToGRPC(err)) != codes.Internal || err.Error() != "failing with no kind" {
		t.Errorf("an error of no kind: %v", err)
	}
}

// TestConversionPair: the agent's wires use errdefs' pair (tested there), plus ttrpc's closed connection
// as Unavailable.
func TestConversionPair(t *testing.T) {
	if ToGRPC(nil) != nil || FromGRPC(nil) != nil {
		t.Fatal("nil must stay nil")
	}
	if err := FromGRPC(fmt.Errorf("call: %w", ttrpc.ErrClosed)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a closed connection: %v, want ErrUnavailable", err)
	}
	for name, kind := range testKinds {
		err := FromGRPC(ToGRPC(fmt.Errorf("disk vol-1: %w", kind)))
		if !errors.Is(err, kind) {
			t.Errorf("%s: round trip gave %v", name, err)
		}
	}
}

// TestHostReconnectLeavesNoHalfFrame: a host that goes away with half a frame written, and a guest whose
// answers to it are still in the port, do not keep the next host from talking to the agent.
func TestHostReconnectLeavesNoHalfFrame(t *testing.T) {
	b, port := newBridge(t)
	a := serveAgent(t, port)

	// A first host whose call is still running when it goes away: the answer comes later, to the next.
	first := dial(t, b)
	go func() { _, _ = first.Exec(context.Background(), &agentv1.ExecRequest{Argv: []string{"block", "old"}}) }()
	<-a.started
	_ = first.Close()

	// A host that writes a frame's header and part of its payload, then goes away.
	half := appendFrame(nil, kindData, 42, bytes.Repeat([]byte{7}, 1000))
	raw := b.rawHost(t)
	if _, err := raw.Write(half[:headerSize+100]); err != nil {
		t.Fatal(err)
	}
	_ = raw.Close()

	// The old session's answer waits in the port for the next host.
	close(a.gate("old"))

	for i := range 3 {
		c := dial(t, b)
		res, err := c.Exec(t.Context(), &agentv1.ExecRequest{Argv: []string{"again", fmt.Sprint(i)}})
		if err != nil || string(res.GetStdout()) != "again "+fmt.Sprint(i) {
			t.Fatalf("host %d: %q, %v", i, res.GetStdout(), err)
		}
		_ = c.Close()
	}
}

// TestStaleGuestBytes: whatever the port holds from the guest's side when a host connects (a cut frame,
// another session's frames) is skipped.
func TestStaleGuestBytes(t *testing.T) {
	b, port := newBridge(t)
	stale := appendFrame(nil, kindData, 99, []byte("old answer"))
	stale = append(stale, appendFrame(nil, kindAck, 99, nil)...)
	cut := appendFrame(nil, kindData, 99, bytes.Repeat([]byte{1}, maxPayload))
	stale = append(stale, cut[:len(cut)/2]...)
	// Written on the guest's side before the agent serves: they wait in the bridge for the host.
	if _, err := port.Write(stale); err != nil {
		t.Fatal(err)
	}
	serveAgent(t, port)
	c := dial(t, b)
	if _, err := c.Health(t.Context(), &agentv1.HealthRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestDialBeforeTheAgent: an open sent before the agent has its port open is lost; the agent's hello
// makes the host send it again, so Dial returns once the agent serves, without polling.
func TestDialBeforeTheAgent(t *testing.T) {
	b, port := newBridge(t)
	b.mu.Lock()
	b.dropHost = true
	b.mu.Unlock()
	dialed := make(chan error, 1)
	go func() {
		c, err := Dial(t.Context(), b.path)
		if err == nil {
			_, err = c.Health(t.Context(), &agentv1.HealthRequest{})
			_ = c.Close()
		}
		dialed <- err
	}()
	b.mu.Lock()
	for b.hostWrites == 0 { // the first open is on its way, and lost
		b.cond.Wait()
	}
	b.dropHost = false
	b.mu.Unlock()
	serveAgent(t, port)
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
}

func TestFrameReaderResyncs(t *testing.T) {
	good := appendFrame(nil, kindData, 5, []byte("payload"))
	badHeader := slices.Clone(good)
	badHeader[10] ^= 0xff // the session, under the header checksum
	badPayload := slices.Clone(good)
	badPayload[headerSize] ^= 0xff
	var in []byte
	in = append(in, "garbage crs1 crs"...)
	in = append(in, badHeader...)
	in = append(in, badPayload...)
	in = append(in, good[:headerSize+3]...) // a cut frame ...
	in = appendPad(in)                      // ... ended by a pad
	in = append(in, good...)
	fr := newFrameReader(bytes.NewReader(in))
	f, err := fr.next()
	if err != nil || f.kind != kindData || f.session != 5 || string(f.payload) != "payload" {
		t.Fatalf("next = %+v, %v", f, err)
	}
	if _, err := fr.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
	if _, err := newFrameReader(bytes.NewReader(good[:len(good)-1])).next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut frame at the end: %v, want io.ErrUnexpectedEOF", err)
	}
}

// FuzzFrameReader: the decoder never panics; every frame it returns is valid and was in its input; and a
// valid frame after any input and a pad is found.
func FuzzFrameReader(f *testing.F) {
	f.Add(appendFrame(nil, kindOpen, 1, nil))
	f.Add(appendFrame(nil, kindData, 1<<63, []byte("x")))
	f.Add(append([]byte("crs1"), appendFrame(nil, kindAck, 3, nil)[:20]...))
	f.Fuzz(func(t *testing.T, in []byte) {
		marker := appendFrame(nil, kindData, 0xfeed, []byte("marker"))
		all := appendPad(slices.Clone(in))
		all = append(all, marker...)
		fr := newFrameReader(bytes.NewReader(all))
		for {
			fr, err := fr.next()
			if err != nil {
				t.Fatalf("the marker frame was not found: %v", err)
			}
			enc := appendFrame(nil, fr.kind, fr.session, fr.payload)
			if !bytes.Contains(all, enc) || len(fr.payload) > maxPayload {
				t.Fatalf("frame %+v was not in the input", fr)
			}
			if bytes.Equal(enc, marker) {
				return
			}
		}
	})
}

// FuzzListenPort: whatever a host writes on the port, the guest's end never panics, and a proper session
// opened after it (and a pad) is served.
func FuzzListenPort(f *testing.F) {
	f.Add(appendFrame(nil, kindData, 1, []byte("not a ttrpc message")))
	f.Add(append(appendFrame(nil, kindOpen, 7, nil), appendFrame(nil, kindData, 7, []byte{0, 0, 0, 9, 0, 0, 0, 1, 1, 0})...))
	f.Fuzz(func(t *testing.T, in []byte) {
		b, port := newBridge(t)
		serveAgent(t, port)
		raw := b.rawHost(t)
		if _, err := raw.Write(in); err != nil {
			t.Fatal(err)
		}
		_ = raw.Close()
		c := dial(t, b)
		if _, err := c.Health(t.Context(), &agentv1.HealthRequest{}); err != nil {
			t.Fatal(err)
		}
	})
}
