// Package dirlock gives one process at a time a state directory: crustd's and the CSI proxy's. Two
// daemons on one state directory would overwrite each other's records; the second must stop at once,
// naming the first.
//
// What it promises: Acquire takes an exclusive, non-blocking flock(2) on <dir>/lock, a regular file it
// opens relative to dir without following a symbolic link, and writes the holder's pid and name into it. The lock is
// the kernel's: it goes with the holder's process, however that ends, so a crash never leaves a stale
// lock. A second Acquire, from any process, fails at once with ErrHeld and the holder's pid and name.
package dirlock

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"crust.dev/crust/pkg/safedir"
)

// ErrHeld is wrapped by Acquire's error when another holder has the directory.
var ErrHeld = errors.New("state directory in use")

// Lock is a held directory.
type Lock struct{ f *os.File }

// Acquire locks dir for this process, recording who as the holder's name (such as "crustd"). dir is
// created (0700) when missing and opened as safedir.OpenOwned does: a symbolic link at its place, a
// directory another user owns or may write in, or anything but a regular file at <dir>/lock is refused
// with an error naming it, before anything is created in it.
func Acquire(dir, who string) (*Lock, error) {
	d, err := safedir.OpenOwned(dir)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	f, err := d.OpenFile("lock", os.O_RDWR|os.O_CREATE, 0o600)
	_ = d.Close()
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := "unknown"
		if b, rerr := io.ReadAll(io.NewSectionReader(f, 0, 4096)); rerr == nil && len(strings.TrimSpace(string(b))) > 0 {
			holder = strings.TrimSpace(string(b))
		}
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is held by %s: %w", dir, holder, ErrHeld)
		}
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = fmt.Fprintf(f, "pid %d (%s)\n", os.Getpid(), who)
	}
	return &Lock{f: f}, nil
}

// Release gives the directory up. It is safe to call more than once.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Close() // closing the only descriptor drops the flock
	l.f = nil
}
