// Package dirlock gives one process at a time a state directory: crustd's and the CSI proxy's. Two
// daemons on one state directory would overwrite each other's records; the second must stop at once,
// naming the first.
//
// What it promises: Acquire takes the lock of api/safedir (Dir.Lock: an exclusive, non-blocking flock(2))
// on <dir>/lock, a regular file it opens relative to dir without following a symbolic link, and writes
// the holder's pid and name into it. The lock is the kernel's: it goes with the holder's process, however
// that ends, so a crash never leaves a stale lock. A second Acquire, from any process, fails at once with
// ErrHeld and the holder's pid and name. (The lock itself is in api/safedir because runtime handlers,
// which must not import crust's internal packages, lock their state directories the same way.)
package dirlock

import (
	"fmt"

	"crust.dev/crust/api/safedir"
)

// ErrHeld is wrapped by Acquire's error when another holder has the directory.
var ErrHeld = safedir.ErrLocked

// Lock is a held directory.
type Lock = safedir.Lock

// Acquire locks dir for this process, recording who as the holder's name (such as "crustd"). dir is
// created (0700) when missing and opened as safedir.OpenOwned does: a symbolic link at its place, a
// directory another user owns or may write in, or anything but a regular file at <dir>/lock is refused
// with an error naming it, before anything is created in it.
func Acquire(dir, who string) (*Lock, error) {
	d, err := safedir.OpenOwned(dir)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	defer func() { _ = d.Close() }()
	l, err := d.Lock("lock", who)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	return l, nil
}
