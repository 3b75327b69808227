package handlerwatch

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestProbe takes only a refusal for a dead endpoint: a missing socket, a socket file nobody listens on
// (what a killed handler leaves) and a regular file refuse; a listening socket is alive.
func TestProbe(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	stale := filepath.Join(dir, "stale.sock")
	ls, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ls.(*net.UnixListener).SetUnlinkOnClose(false) // as after a kill: the file stays
	_ = ls.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		endpoint string
		refused  bool
	}{
		{"unix://" + live, false},
		{"unix:" + live, false},
		{"unix://" + filepath.Join(dir, "missing.sock"), true},
		{"unix://" + filepath.Join(dir, "missing-dir", "h.sock"), true},
		{"unix://" + stale, true},
		{"unix://" + file, true},
	} {
		if err := probe(c.endpoint); (err != nil) != c.refused {
			t.Errorf("probe(%s) = %v, want refused %t", c.endpoint, err, c.refused)
		}
	}
}
