package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}`

// fakeQEMU is a scripted QMP peer: it greets, accepts qmp_capabilities and
// then hands each later command to the test through cmds.
type fakeQEMU struct {
	t    *testing.T
	conn net.Conn
	in   *bufio.Scanner
	cmds chan command
}

type command struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func startFake(t *testing.T, greet string) (path string, accepted <-chan *fakeQEMU) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ch := make(chan *fakeQEMU, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		f := &fakeQEMU{t: t, conn: conn, in: bufio.NewScanner(conn), cmds: make(chan command, 16)}
		t.Cleanup(func() { _ = conn.Close() })
		f.send(greet)
		if greet == "" {
			_ = conn.Close()
			return
		}
		c, ok := f.next()
		if !ok {
			return // the client gave up on the greeting
		}
		if c.Execute != "qmp_capabilities" {
			f.t.Errorf("first command = %+v, want qmp_capabilities", c)
			return
		}
		f.send(fmt.Sprintf(`{"return": {}, "id": %s}`, c.ID))
		ch <- f
		for {
			c, ok := f.next()
			if !ok {
				close(f.cmds)
				return
			}
			f.cmds <- c
		}
	}()
	return path, ch
}

func (f *fakeQEMU) next() (command, bool) {
	if !f.in.Scan() {
		return command{}, false
	}
	var c command
	if err := json.Unmarshal(f.in.Bytes(), &c); err != nil {
		f.t.Errorf("fake QEMU got %q: %v", f.in.Text(), err)
		return command{}, false
	}
	return c, true
}

func (f *fakeQEMU) send(line string) {
	if line == "" {
		return
	}
	_, _ = f.conn.Write([]byte(line + "\r\n"))
}

func dialFake(t *testing.T) (*Client, *fakeQEMU) {
	t.Helper()
	path, accepted := startFake(t, greeting)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, <-accepted
}

func TestHandshake(t *testing.T) {
	c, _ := dialFake(t)
	if v := c.Version(); v.String() != "7.2.22" || v.Package != "Debian" {
		t.Fatalf("Version = %+v", v)
	}
}

// Two commands in flight are answered in reverse order with an event in
// between; each caller gets its own return value, the subscriber the event.
func TestConcurrentCommandsAndEvents(t *testing.T) {
	c, f := dialFake(t)
	events, cancel := c.Subscribe(4)
	defer cancel()

	type res struct {
		out map[string]any
		err error
	}
	results := make(chan res, 2)
	for _, dev := range []string{"a", "b"} {
		go func() {
			var out map[string]any
			err := c.Execute(context.Background(), "device_del", map[string]string{"id": dev}, &out)
			if err == nil && out["id"] != dev {
				err = fmt.Errorf("answer %v for %s", out, dev)
			}
			results <- res{out, err}
		}()
	}
	first, second := <-f.cmds, <-f.cmds
	var a1, a2 struct{ ID string }
	_ = json.Unmarshal(first.Arguments, &a1)
	_ = json.Unmarshal(second.Arguments, &a2)
	f.send(fmt.Sprintf(`{"return": {"id": %q}, "id": %s}`, a2.ID, second.ID))
	f.send(`{"event": "DEVICE_DELETED", "data": {"device": "a", "path": "/machine/peripheral/a"}, "timestamp": {"seconds": 1700000000, "microseconds": 5}}`)
	f.send(fmt.Sprintf(`{"return": {"id": %q}, "id": %s}`, a1.ID, first.ID))
	for range 2 {
		if r := <-results; r.err != nil {
			t.Fatal(r.err)
		}
	}
	select {
	case ev := <-events:
		var d struct{ Device string }
		_ = json.Unmarshal(ev.Data, &d)
		if ev.Name != "DEVICE_DELETED" || d.Device != "a" || ev.Time.Unix() != 1700000000 {
			t.Fatalf("event = %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
}

func TestErrorAnswer(t *testing.T) {
	c, f := dialFake(t)
	go func() {
		cmd := <-f.cmds
		f.send(fmt.Sprintf(`{"error": {"class": "DeviceNotFound", "desc": "Device 'x' not found"}, "id": %s}`, cmd.ID))
	}()
	err := c.Execute(context.Background(), "device_del", map[string]string{"id": "x"}, nil)
	var qerr *Error
	if !errors.As(err, &qerr) || qerr.Class != "DeviceNotFound" {
		t.Fatalf("error = %v, want DeviceNotFound", err)
	}
}

// When QEMU goes away, a command in flight and later ones fail with
// ErrClosed and subscriptions are closed.
func TestConnectionEnds(t *testing.T) {
	c, f := dialFake(t)
	events, _ := c.Subscribe(1)
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(context.Background(), "quit", nil, nil) }()
	<-f.cmds
	_ = f.conn.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("in-flight error = %v, want ErrClosed", err)
	}
	if _, ok := <-events; ok {
		t.Fatal("subscription not closed")
	}
	if err := c.Execute(context.Background(), "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("later error = %v, want ErrClosed", err)
	}
}

func TestContextEndsCommand(t *testing.T) {
	c, f := dialFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want deadline", err)
	}
	// The late answer is dropped; the next command gets its own.
	late := <-f.cmds
	f.send(fmt.Sprintf(`{"return": {"status": "late"}, "id": %s}`, late.ID))
	go func() {
		cmd := <-f.cmds
		f.send(fmt.Sprintf(`{"return": {"status": "running"}, "id": %s}`, cmd.ID))
	}()
	var st struct{ Status string }
	if err := c.Execute(context.Background(), "query-status", nil, &st); err != nil || st.Status != "running" {
		t.Fatalf("status = %+v, %v", st, err)
	}
}

func TestNoGreeting(t *testing.T) {
	path, _ := startFake(t, `{"hello": 1}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, path); err == nil {
		t.Fatal("Dial succeeded without a QMP greeting")
	}
}

// FuzzReadLoop feeds the client's decoder whatever a QEMU might send after the handshake: it never
// panics, and a command in flight is either answered or fails; none is left waiting.
func FuzzReadLoop(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": 2}` + "\n"))
	f.Add([]byte(`{"event": "DEVICE_DELETED", "data": {"device": "x"}, "timestamp": {"seconds": 1, "microseconds": 2}}` + "\n"))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "no"}, "id": 2}`))
	f.Add([]byte(`{"id": [1,2]}{"return": 1, "id": "2"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, q := dialFake(t)
		events, cancel := c.Subscribe(1)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Execute(context.Background(), "query-status", nil, nil) }()
		if _, ok := <-q.cmds; !ok {
			t.Fatal("the command did not reach QEMU")
		}
		_, _ = q.conn.Write(data)
		_ = q.conn.Close() // QEMU goes away: what was not answered fails
		if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
			var qerr *Error
			if !errors.As(err, &qerr) {
				t.Fatalf("Execute = %v, want an answer, a QMP error or ErrClosed", err)
			}
		}
		for range events { // closed when the connection ends
		}
	})
}
