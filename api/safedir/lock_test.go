package safedir

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// A second Lock on the same file, as another process would take it, fails at once naming the holder;
// LockHolder reads the holder's pid; a released lock can be taken again.
func TestLock(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Close() }()
	if pid := d.LockHolder("lock"); pid != 0 {
		t.Fatalf("LockHolder of a missing file = %d", pid)
	}
	first, err := d.Lock("lock", "me")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Lock("lock", "other"); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "(me)") {
		t.Fatalf("second Lock: %v; want ErrLocked naming the holder", err)
	}
	if pid := d.LockHolder("lock"); pid != os.Getpid() {
		t.Fatalf("LockHolder = %d, want %d", pid, os.Getpid())
	}
	first.Release()
	first.Release()
	second, err := d.Lock("lock", "other")
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	second.Release()
}
