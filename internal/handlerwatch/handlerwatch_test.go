package handlerwatch

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/crisandbox"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/critest"
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

// TestSandboxGone: the sandbox of a claim found through the CRI runtime is gone only when no socket of
// its Kata shim accepts connections and the runtime (a real gRPC server on a unix socket) no longer
// lists it as ready; a runtime that does not answer proves nothing.
func TestSandboxGone(t *testing.T) {
	root := testutil.SocketDir(t)
	goDir, rsDir := filepath.Join(root, "sbs"), filepath.Join(root, "kata")
	cri := (&critest.Server{}).Start(t, filepath.Join(root, "cri.sock"))
	finder := func(endpoint string) *Watcher {
		f, err := crisandbox.New(crisandbox.Config{Endpoint: endpoint, ShimDirs: []string{goDir, rsDir}, Timeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		return New(Config{Sandboxes: f})
	}
	w := finder(cri.Endpoint())
	ctx := context.Background()

	shim := (&katatest.Shim{StatsPostOnly: true}).Start(t, katatest.ShimSocket(rsDir, "sb"))
	for _, tc := range []struct {
		name      string
		shimAlive bool
		ready     bool
		gone      bool
	}{
		{"shim and sandbox there", true, true, false},
		{"shim there, sandbox not ready", true, false, false},
	} {
		cri.Set(critest.Sandbox("sb", "pod", tc.ready))
		if got := w.sandboxGone(ctx, "sb", new(bool)); (got != "") != tc.gone {
			t.Errorf("%s: sandboxGone = %q, want gone %t", tc.name, got, tc.gone)
		}
	}
	shim.Close()
	// A socket file nobody listens on, as a killed shim leaves, at the Go runtime's place.
	if err := os.MkdirAll(filepath.Join(goDir, "sb"), 0o700); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", katatest.ShimSocket(goDir, "sb"))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = stale.Close()
	cri.Set(critest.Sandbox("sb", "pod", true))
	if got := w.sandboxGone(ctx, "sb", new(bool)); got != "" {
		t.Errorf("shim gone, sandbox still ready: gone %q", got)
	}
	cri.Set(critest.Sandbox("sb", "pod", false))
	got := w.sandboxGone(ctx, "sb", new(bool))
	if !strings.Contains(got, "no longer lists sandbox sb as ready") || !strings.Contains(got, "shim-monitor.sock") {
		t.Errorf("shim gone, sandbox stopped: %q, want gone, naming the sockets", got)
	}
	cri.Set()
	if got := w.sandboxGone(ctx, "sb", new(bool)); got == "" {
		t.Error("shim gone, sandbox removed: not gone")
	}
	down := false
	if got := finder("unix://"+filepath.Join(root, "none.sock")).sandboxGone(ctx, "sb", &down); got != "" || !down {
		t.Errorf("shim gone, runtime does not answer: gone %q, runtime down %t", got, down)
	}
	if got := w.sandboxGone(ctx, "sb", &down); got != "" {
		t.Errorf("with the runtime down in this check, it was asked: gone %q", got)
	}
}
