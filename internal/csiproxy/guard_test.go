package csiproxy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// TestGuardTarget: the guard is an empty read-only tmpfs named crust-deferred (nosuid, nodev, noexec, 4
// KiB, its root 0555) on which writes fail with EROFS; mounting it again, as a retry or a restarted
// proxy does, stacks nothing; unguardTarget removes it, and only it: another mount on the target, under
// or over a guard, is left, and no guard is put over one. A missing target is nothing to unguard; a
// target that is a link is never guarded.
func TestGuardTarget(t *testing.T) {
	requireRoot(t)
	target := filepath.Join(t.TempDir(), "mount")
	dir := filepath.Dir(target)
	t.Cleanup(func() {
		for _, m := range mountsUnder(dir) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	mkdirs(t, dir, "mount")
	mounts := func(want int) {
		t.Helper()
		if m := mountsUnder(target); len(m) != want {
			t.Fatalf("mounts on the target %v, want %d", m, want)
		}
	}
	isGuarded := func(want bool) {
		t.Helper()
		if on, err := guarded(target); err != nil || on != want {
			t.Fatalf("guarded: %v, %v; want %v", on, err, want)
		}
	}

	for range 2 {
		if err := guardTarget(target); err != nil {
			t.Fatal(err)
		}
	}
	mounts(1)
	isGuarded(true)
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil || len(ms) != 1 {
		t.Fatalf("the guard's entry: %v, %v", ms, err)
	}
	m := ms[0]
	opts := strings.Split(m.Options, ",")
	if m.FSType != "tmpfs" || m.Source != guardSource || !slices.Contains(opts, "ro") || !slices.Contains(opts, "nosuid") ||
		!slices.Contains(opts, "nodev") || !slices.Contains(opts, "noexec") {
		t.Errorf("the guard: %s %s %s, want tmpfs %s ro,nosuid,nodev,noexec", m.FSType, m.Source, m.Options, guardSource)
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("the guard's root: %v, %v; want mode 0555", fi.Mode(), err)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), nil, 0o600); !errors.Is(err, unix.EROFS) {
		t.Errorf("a write through the guard: %v, want EROFS", err)
	}
	for range 2 {
		if err := unguardTarget(target); err != nil {
			t.Fatal(err)
		}
	}
	mounts(0)
	isGuarded(false)

	// Another mount on the target: no guard over it, and unguardTarget leaves it.
	if err := unix.Mount("other", target, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatal(err)
	}
	isGuarded(false)
	if err := guardTarget(target); err != nil {
		t.Fatal(err)
	}
	mounts(1)
	if err := unguardTarget(target); err != nil {
		t.Fatal(err)
	}
	mounts(1)
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	// Another mount over a guard: both stay.
	if err := guardTarget(target); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("other", target, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatal(err)
	}
	if err := unguardTarget(target); err != nil {
		t.Fatal(err)
	}
	mounts(2)

	if err := unguardTarget(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("unguard a missing target: %v", err)
	}
	link, dest := filepath.Join(dir, "link"), t.TempDir()
	if err := os.Symlink(dest, link); err != nil {
		t.Fatal(err)
	}
	if err := guardTarget(link); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("guard a link: %v, want it refused", err)
	}
	if m := mountsUnder(dest); len(m) != 0 {
		t.Errorf("mounts through the link: %v", m)
	}
}
