package safedir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrLocked is wrapped by Lock's error when another holder has the lock.
var ErrLocked = errors.New("locked by another holder")

// A Lock is a held lock on a file of a Dir (see Dir.Lock).
type Lock struct{ f *os.File }

// Lock takes an exclusive flock(2) on the regular file name of d, created mode 0600 when missing and never
// reached through a link, and writes "pid <pid> (<holder>)\n" into it so that others can name the holder.
// It does not wait: when another open file description (another process, or another Lock) holds the
// lock, it fails at once with an error wrapping ErrLocked that names the holder as the file says. The lock
// is the kernel's: it goes with the holder's process, however that ends, so a crash never leaves a stale
// lock. This is the one lock crust's programs put on a state directory.
func (d *Dir) Lock(name, holder string) (*Lock, error) {
	f, err := d.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		who := "unknown"
		if b, rerr := io.ReadAll(io.NewSectionReader(f, 0, 4096)); rerr == nil && strings.TrimSpace(string(b)) != "" {
			who = strings.TrimSpace(string(b))
		}
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is held by %s: %w", d.path, who, ErrLocked)
		}
		return nil, &os.PathError{Op: "flock", Path: d.Join(name), Err: err}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = fmt.Fprintf(f, "pid %d (%s)\n", os.Getpid(), holder)
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up. It is safe to call more than once, and on a nil Lock.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Close() // closing the only descriptor drops the flock
	l.f = nil
}

// LockHolder returns the pid that the last holder of the lock file name of d wrote (see Lock), or 0 when
// there is none or the file says something else. The holder may have exited since.
func (d *Dir) LockHolder(name string) int {
	b, err := d.ReadFile(name, 4096)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 || f[0] != "pid" {
		return 0
	}
	pid, _ := strconv.Atoi(f[1])
	return pid
}
