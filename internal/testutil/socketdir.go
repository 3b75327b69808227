package testutil

import (
	"os"
	"testing"
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
