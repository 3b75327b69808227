package crustd

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/api/version"
)

// A call through Dial to a socket that cannot be connected to is Unavailable, and says what to check.
func TestDialHints(t *testing.T) {
	dir := t.TempDir()
	refused := filepath.Join(dir, "refused.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: refused, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false) // the socket file stays, with nobody listening
	_ = l.Close()
	for _, tc := range []struct {
		name, socket string
		want         []string
	}{
		{"missing", filepath.Join(dir, "none.sock"), []string{"no crustd is serving at " + filepath.Join(dir, "none.sock"), "--crust-socket", "CRUST_SOCKET"}},
		{"missing, unix address", "unix://" + filepath.Join(dir, "none.sock"), []string{"no crustd is serving at " + filepath.Join(dir, "none.sock")}},
		{"refused", refused, []string{"no crustd is listening on it", "--crust-socket"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := Dial(tc.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("Check: %v, want Unavailable", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestDialHint(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string // "": returned as it is
	}{
		{&net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}, "run as root, and check that crustd's --allow-uid/--allow-gid admit uid"},
		{fmt.Errorf("x: %w", syscall.EPERM), "--allow-uid/--allow-gid"},
		{syscall.ENOENT, "no crustd is serving at /s.sock"},
		{syscall.ECONNREFUSED, "no crustd is listening on it"},
		{syscall.ETIMEDOUT, ""},
	} {
		got := DialHint("/s.sock", tc.err)
		if tc.want == "" {
			if got != tc.err {
				t.Errorf("DialHint(%v) = %v, want it unchanged", tc.err, got)
			}
			continue
		}
		if !strings.Contains(got.Error(), tc.want) || !strings.HasPrefix(got.Error(), tc.err.Error()) {
			t.Errorf("DialHint(%v) = %q, want the error, then %q", tc.err, got, tc.want)
		}
	}
}

// Dial and unixsocket.Dial send crust's version in their user agent; unixsocket.Dial adds no crustd hints.
func TestUserAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	agents := make(chan string, 2)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		agents <- strings.Join(md.Get("user-agent"), ",")
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	for name, dial := range map[string]func(string, ...grpc.DialOption) (*grpc.ClientConn, error){
		"Dial":            Dial,
		"unixsocket.Dial": func(s string, o ...grpc.DialOption) (*grpc.ClientConn, error) { return unixsocket.Dial(s, nil, o...) },
	} {
		conn, err := dial(sock)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_ = conn.Close()
		if ua := <-agents; !strings.HasPrefix(ua, version.UserAgent()+" ") {
			t.Errorf("%s: user agent %q, want it to start with %q", name, ua, version.UserAgent())
		}
	}
	conn, err := unixsocket.Dial(filepath.Join(t.TempDir(), "none.sock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err == nil || strings.Contains(err.Error(), "crustd") {
		t.Errorf("unixsocket.Dial to a missing socket: %v, want an error that does not speak of crustd", err)
	}
}
