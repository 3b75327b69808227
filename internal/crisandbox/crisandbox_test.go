package crisandbox

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/critest"
)

func newFinder(t *testing.T, endpoint string, dirs ...string) *Finder {
	t.Helper()
	f, err := New(Config{Endpoint: endpoint, ShimDirs: dirs, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// TestKataSandboxes: of a pod's sandboxes, those the runtime lists as ready and whose Kata shim serves a
// socket, in either shim directory; none of another pod's; none whose socket is a link, a plain file,
// someone else's, or in a directory that is a link.
func TestKataSandboxes(t *testing.T) {
	testutil.RequireRoot(t, "to give files to another user")
	root := testutil.SocketDir(t)
	goDir, rsDir := filepath.Join(root, "sbs"), filepath.Join(root, "kata")
	cri := (&critest.Server{}).Start(t, filepath.Join(root, "cri.sock"))
	f := newFinder(t, cri.Endpoint(), goDir, rsDir)
	ctx := context.Background()

	(&katatest.Shim{StatsPostOnly: true}).Start(t, katatest.ShimSocket(rsDir, "rs1"))
	(&katatest.Shim{}).Start(t, katatest.ShimSocket(goDir, "go1"))
	(&katatest.Shim{StatsPostOnly: true}).Start(t, katatest.ShimSocket(rsDir, "notready"))
	(&katatest.Shim{StatsPostOnly: true}).Start(t, katatest.ShimSocket(rsDir, "otherpod"))
	// A link to a live socket, a plain file, a socket of another user, a link as the sandbox directory.
	must(t, os.MkdirAll(filepath.Join(rsDir, "link"), 0o700))
	must(t, os.Symlink(katatest.ShimSocket(rsDir, "rs1"), katatest.ShimSocket(rsDir, "link")))
	must(t, os.MkdirAll(filepath.Join(rsDir, "file"), 0o700))
	must(t, os.WriteFile(katatest.ShimSocket(rsDir, "file"), nil, 0o600))
	(&katatest.Shim{}).Start(t, katatest.ShimSocket(rsDir, "nobody"))
	must(t, os.Lchown(katatest.ShimSocket(rsDir, "nobody"), 65534, 65534))
	must(t, os.Symlink(filepath.Join(rsDir, "rs1"), filepath.Join(rsDir, "dirlink")))
	// A ready sandbox with no shim at all (runc, or crust's own handler).
	cri.Set(
		critest.Sandbox("rs1", "pod-a", true), critest.Sandbox("go1", "pod-b", true),
		critest.Sandbox("notready", "pod-a", false), critest.Sandbox("otherpod", "pod-z", true),
		critest.Sandbox("link", "pod-a", true), critest.Sandbox("file", "pod-a", true),
		critest.Sandbox("nobody", "pod-a", true), critest.Sandbox("dirlink", "pod-a", true),
		critest.Sandbox("noshim", "pod-a", true), critest.Sandbox("../kata/rs1", "pod-a", true),
	)
	for pod, want := range map[string]map[string][]string{
		"pod-a":    {"pod-a": {"rs1"}},
		"pod-b":    {"pod-b": {"go1"}},
		"pod-none": {},
		"":         {"pod-a": {"rs1"}, "pod-b": {"go1"}, "pod-z": {"otherpod"}},
	} {
		got, err := f.KataSandboxes(ctx, pod)
		if err != nil || !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("KataSandboxes(%q) = %q, %v; want %q", pod, got, err, want)
		}
	}
	cri.Set(critest.Sandbox("rs1", "pod-a", true), critest.Sandbox("go1", "pod-a", true))
	if got, _ := f.KataSandboxes(ctx, "pod-a"); !slices.Equal(got["pod-a"], []string{"go1", "rs1"}) {
		t.Errorf("two sandboxes: %q", got)
	}
	for id, want := range map[string]bool{"rs1": true, "go1": true, "notready": false, "gone": false} {
		cri.Set(critest.Sandbox("rs1", "pod-a", true), critest.Sandbox("go1", "pod-a", true), critest.Sandbox("notready", "pod-a", false))
		if got, err := f.Ready(ctx, id); err != nil || got != want {
			t.Errorf("Ready(%s) = %t, %v; want %t", id, got, err, want)
		}
	}
}

// TestNoRuntime: a CRI socket that is absent is an Unavailable error at once; one that does not
// answer is the same error after the timeout, not later.
func TestNoRuntime(t *testing.T) {
	root := testutil.SocketDir(t)
	ctx := context.Background()
	f := newFinder(t, "unix://"+filepath.Join(root, "none.sock"))
	t0 := time.Now()
	if _, err := f.KataSandboxes(ctx, "pod-a"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("absent runtime: %v", err)
	}
	if _, err := f.Ready(ctx, "sb"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("absent runtime: %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("an absent runtime took %s to fail", d)
	}

	// Something listens but never answers: the timeout (300 ms) ends the call.
	testutil.Listen(t, filepath.Join(root, "mute.sock"))
	f = newFinder(t, "unix://"+filepath.Join(root, "mute.sock"))
	t0 = time.Now()
	if _, err := f.KataSandboxes(ctx, "pod-a"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("mute runtime: %v", err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("a mute runtime took %s to fail, want about the 300ms timeout", d)
	}

	// A runtime slower than the timeout.
	slow := (&critest.Server{Delay: 5 * time.Second}).Start(t, filepath.Join(root, "slow.sock"))
	f = newFinder(t, slow.Endpoint())
	t0 = time.Now()
	if _, err := f.KataSandboxes(ctx, "pod-a"); !errors.Is(err, errdefs.ErrUnavailable) || time.Since(t0) > 3*time.Second {
		t.Fatalf("slow runtime: %v after %s", err, time.Since(t0))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
