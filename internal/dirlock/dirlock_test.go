package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/api/safedir/safedirtest"
)

func TestAcquire(t *testing.T) {
	dir := t.TempDir()
	first, err := Acquire(dir, "crustd")
	if err != nil {
		t.Fatal(err)
	}
	// Another open file description, as another process would have: refused, naming the holder.
	_, err = Acquire(dir, "crustd")
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (crustd)", os.Getpid())) {
		t.Fatalf("second Acquire: %v; want ErrHeld naming pid %d", err, os.Getpid())
	}
	first.Release()
	first.Release()
	second, err := Acquire(dir, "other")
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	second.Release()
}

// A planted symbolic link or directory at the lock's place is refused, and nothing is written through it.
func TestHostileLockFile(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "lock")); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(dir, "crustd"); err == nil {
		t.Fatal("a symbolic link at the lock's place was followed")
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the link's target was written: %q", b)
	}
	dir2 := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir2, "lock"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(dir2, "crustd"); err == nil {
		t.Fatal("a directory at the lock's place was accepted")
	}
}

// A state directory that is a symbolic link, or that another user owns or may write in, is refused before
// a lock file is created in it.
func TestHostileStateDir(t *testing.T) {
	safedirtest.EachDir(t, []safedirtest.Dir{
		{Name: "a link at its place", Mode: 0o700, Link: true},
		{Name: "mode 0777", Mode: 0o777},
		{Name: "another user's", Mode: 0o700, UID: 1000},
	}, func(t *testing.T, _ safedirtest.Dir, dir, target string) {
		l, err := Acquire(dir, "crustd")
		if err == nil {
			l.Release()
			t.Fatal("Acquire took the lock")
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("the error does not name %s: %v", dir, err)
		}
		if entries, _ := os.ReadDir(target); len(entries) != 0 {
			t.Errorf("Acquire created %v", entries)
		}
	})
}
