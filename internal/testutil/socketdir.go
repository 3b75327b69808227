package testutil

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
)

// SocketDir returns a new directory with a short name, removed when the test ends, for unix sockets:
// their paths must fit in 107 bytes, which t.TempDir's names often do not leave room for.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "crust")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Listen listens on the unix socket at path, making its directory (mode 0700) when missing, and closes
// the listener when the test ends.
func Listen(t testing.TB, path string) net.Listener {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// ServeGRPC serves, on the unix socket at path (see Listen) until the test ends, a gRPC server with the
// services register puts on it. It returns the server, which the test may stop earlier (Stop is safe to
// call again at cleanup).
func ServeGRPC(t testing.TB, path string, register func(*grpc.Server)) *grpc.Server {
	t.Helper()
	l := Listen(t, path)
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return srv
}
