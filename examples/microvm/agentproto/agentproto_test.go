package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// pair connects a Client to a Server over an in-memory pipe.
func pair(t *testing.T, h Handler) *Client {
	t.Helper()
	host, guest := net.Pipe()
	srv := &Server{Handler: h}
	go func() { _ = srv.Serve(context.Background(), guest, guest) }()
	c := NewClient(host)
	t.Cleanup(func() {
		_ = c.Close()
		_ = guest.Close()
	})
	return c
}

func TestCallRoundTrip(t *testing.T) {
	c := pair(t, func(_ context.Context, req Request) (any, error) {
		switch req.Op {
		case OpPing:
			return PingResult{Kernel: "6.1"}, nil
		case OpStatfs:
			var a StatfsArgs
			if err := json.Unmarshal(req.Args, &a); err != nil {
				return nil, err
			}
			if a.Target != "/v" {
				return nil, Errorf(CodeNotFound, "%s is not mounted", a.Target)
			}
			return StatfsResult{Bytes: Usage{Total: 10, Used: 4, Available: 6}}, nil
		case OpUnmount:
			return nil, nil
		case OpExec:
			return nil, errors.New("boom")
		}
		return nil, Errorf(CodeUnimplemented, "%s", req.Op)
	})
	ctx := context.Background()

	p, err := c.Ping(ctx)
	if err != nil || p.Kernel != "6.1" {
		t.Fatalf("Ping = %+v, %v", p, err)
	}
	st, err := c.Statfs(ctx, "/v")
	if err != nil || st.Bytes.Available != 6 {
		t.Fatalf("Statfs = %+v, %v", st, err)
	}
	_, err = c.Statfs(ctx, "/nope")
	var perr *Error
	if !errors.As(err, &perr) || perr.Code != CodeNotFound {
		t.Fatalf("Statfs(/nope) error = %v, want not_found", err)
	}
	if err := c.Unmount(ctx, "/v"); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	_, err = c.Exec(ctx, ExecArgs{Argv: []string{"x"}})
	if !errors.As(err, &perr) || perr.Code != CodeInternal || perr.Message != "boom" {
		t.Fatalf("Exec error = %v, want internal boom", err)
	}
	err = c.Call(ctx, "frobnicate", nil, nil)
	if !errors.As(err, &perr) || perr.Code != CodeUnimplemented {
		t.Fatalf("unknown op error = %v", err)
	}
}

// Concurrent calls are answered out of order and each caller gets its own answer.
func TestConcurrentCallsOutOfOrder(t *testing.T) {
	c := pair(t, func(_ context.Context, req Request) (any, error) {
		var a ExecArgs
		_ = json.Unmarshal(req.Args, &a)
		d, _ := time.ParseDuration(a.Argv[0])
		time.Sleep(d)
		return ExecResult{Stdout: []byte(a.Argv[0])}, nil
	})
	var wg sync.WaitGroup
	for _, d := range []string{"60ms", "1ms", "30ms", "0s", "45ms"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Exec(context.Background(), ExecArgs{Argv: []string{d}})
			if err != nil || string(r.Stdout) != d {
				t.Errorf("Exec(%s) = %q, %v", d, r.Stdout, err)
			}
		}()
	}
	wg.Wait()
}

// A call whose context ends returns at once; its late answer is dropped and
// the client goes on working.
func TestCallContextAndLateAnswer(t *testing.T) {
	release := make(chan struct{})
	c := pair(t, func(_ context.Context, req Request) (any, error) {
		if req.Op == OpGrow {
			<-release
		}
		return PingResult{Kernel: string(req.Op)}, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Grow(ctx, GrowArgs{Target: "/v"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Grow error = %v, want deadline", err)
	}
	close(release)
	p, err := c.Ping(context.Background())
	if err != nil || p.Kernel != "ping" {
		t.Fatalf("Ping after a dropped answer = %+v, %v", p, err)
	}
}

func TestClosedConnection(t *testing.T) {
	host, guest := net.Pipe()
	c := NewClient(host)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Ping(context.Background())
		errc <- err
	}()
	// Read the request, then hang up without answering.
	if _, err := NewLineReader(guest, 0).ReadLine(); err != nil {
		t.Fatal(err)
	}
	_ = guest.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending call error = %v, want ErrClosed", err)
	}
	<-c.Done()
	if _, err := c.Ping(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("later call error = %v, want ErrClosed", err)
	}
}

// The server answers garbage and over-long lines with id 0 and keeps serving.
func TestServerRefusesBadLines(t *testing.T) {
	host, guest := net.Pipe()
	defer func() { _ = host.Close() }()
	srv := &Server{Handler: func(context.Context, Request) (any, error) { return PingResult{Kernel: "k"}, nil }}
	go func() { _ = srv.Serve(context.Background(), guest, guest) }()
	lr := NewLineReader(host, 0)
	go func() {
		_, _ = io.WriteString(host, "not json\n")
		_, _ = io.WriteString(host, `{"id":0,"op":"ping"}`+"\n")
		_, _ = host.Write(append(bytes.Repeat([]byte("x"), MaxLineBytes+10), '\n'))
		_, _ = io.WriteString(host, `{"id":5,"op":"ping"}`+"\n")
	}()
	for i := range 4 {
		line, err := lr.ReadLine()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := DecodeResponse(line)
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 && (resp.ID != 0 || resp.Error == nil || resp.Error.Code != CodeInvalidArgument) {
			t.Fatalf("response %d = %s, want id 0 invalid_argument", i, line)
		}
		if i == 3 && (resp.ID != 5 || resp.Error != nil) {
			t.Fatalf("response %d = %s, want id 5 ok", i, line)
		}
	}
}

func TestLineReader(t *testing.T) {
	in := "a\n" + strings.Repeat("b", 20) + "\nc\nlast"
	lr := NewLineReader(strings.NewReader(in), 10)
	want := []struct {
		line string
		err  error
	}{{"a", nil}, {"", ErrLineTooLong}, {"c", nil}, {"last", nil}, {"", io.EOF}}
	for i, w := range want {
		line, err := lr.ReadLine()
		if string(line) != w.line || !errors.Is(err, w.err) {
			t.Fatalf("line %d = %q, %v; want %q, %v", i, line, err, w.line, w.err)
		}
	}
}

func TestEncodeLineIsOneLine(t *testing.T) {
	line, err := EncodeLine(Request{ID: 1, Op: OpExec, Args: json.RawMessage("{\n \"argv\": [\"a\\nb\"]\n}")})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(line, []byte("\n")) != 1 || line[len(line)-1] != '\n' {
		t.Fatalf("EncodeLine = %q, want exactly one trailing newline", line)
	}
	if _, err := EncodeLine(ExecResult{Stdout: make([]byte, MaxLineBytes)}); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("oversized EncodeLine error = %v", err)
	}
	// Two full exec outputs still fit one line.
	if _, err := EncodeLine(Response{ID: 1, Result: mustJSON(t, ExecResult{Stdout: make([]byte, MaxExecOutput), Stderr: make([]byte, MaxExecOutput)})}); err != nil {
		t.Fatalf("full exec result: %v", err)
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecodeRequest: the decoder never panics, and whatever it accepts
// survives an encode/decode round trip unchanged.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"id":1,"op":"ping"}`))
	f.Add([]byte(`{"id":2,"op":"mount","args":{"serial":"v1","target":"/v","fs_group":2000}}`))
	f.Add([]byte(`{"id":3,"op":"exec","args":{"argv":["sh","-c","true"]}} {"id":4}`))
	f.Add([]byte(`[1,2]`))
	f.Add([]byte(`{"id":18446744073709551615,"op":"x","args":null}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := DecodeRequest(line)
		if err != nil {
			return
		}
		if req.ID == 0 || req.Op == "" {
			t.Fatalf("accepted %q as %+v", line, req)
		}
		enc, err := EncodeLine(req)
		if err != nil {
			return // args that grew past the bound when re-encoded
		}
		again, err := DecodeRequest(enc[:len(enc)-1])
		if err != nil {
			t.Fatalf("re-decoding %q: %v", enc, err)
		}
		if again.ID != req.ID || again.Op != req.Op {
			t.Fatalf("round trip changed %+v into %+v", req, again)
		}
		if len(req.Args) > 0 && string(req.Args) != "null" {
			var a, b any
			if json.Unmarshal(req.Args, &a) == nil && json.Unmarshal(again.Args, &b) == nil {
				ja, _ := json.Marshal(a)
				jb, _ := json.Marshal(b)
				if !bytes.Equal(ja, jb) {
					t.Fatalf("round trip changed args %s into %s", req.Args, again.Args)
				}
			}
		}
	})
}

// FuzzLineReader: no line is ever longer than the bound and the reader
// always makes progress to EOF.
func FuzzLineReader(f *testing.F) {
	f.Add([]byte("a\nbb\n"), 2)
	f.Add([]byte(strings.Repeat("x", 100)+"\ny"), 10)
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		if limit < 1 || limit > 1<<16 {
			return
		}
		lr := NewLineReader(bytes.NewReader(data), limit)
		for i := 0; ; i++ {
			if i > len(data)+1 {
				t.Fatalf("no progress after %d lines", i)
			}
			line, err := lr.ReadLine()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil && !errors.Is(err, ErrLineTooLong) {
				t.Fatal(err)
			}
			if len(line) > limit {
				t.Fatalf("line of %d bytes over bound %d", len(line), limit)
			}
		}
	})
}

// FuzzDecodeResponse feeds the host's decoder what a guest might send: the guest is not trusted, so any
// line must decode or be refused without a panic, and an accepted response must survive a round trip.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"id":1,"result":{"kernel":"6.1.0","uptime_ms":12}}`))
	f.Add([]byte(`{"id":2,"error":{"code":"not_found","message":"no disk vol-1"}}`))
	f.Add([]byte(`{"id":0,"error":{"code":"invalid_argument","message":"bad line"}}`))
	f.Add([]byte(`{"id":3,"result":null} trailing`))
	f.Add([]byte(`{"id":-1}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		resp, err := DecodeResponse(line)
		if err != nil {
			return
		}
		enc, err := EncodeLine(resp)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", line, err)
		}
		again, err := DecodeResponse(enc)
		if err != nil || again.ID != resp.ID || (again.Error == nil) != (resp.Error == nil) {
			t.Fatalf("round trip of %q: %+v, %v; want %+v", line, again, err, resp)
		}
	})
}
