package vmhandler

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/safedir"
)

// Files of a sandbox's state directory.
const (
	lockFile      = "lock"
	pidFile       = "qemu.pid"
	handlerSocket = "handler.sock"
	controlSocket = "control.sock"
)

// stale are the files a run process that was killed may leave behind (the VM's sockets included).
var stale = []string{handlerSocket, controlSocket, "qmp.sock", "agent.sock", pidFile}

// state is a sandbox's state directory, locked by this process.
type state struct {
	dir  string
	lock *safedir.Lock
}

func (s *state) path(name string) string { return filepath.Join(s.dir, name) }

// lockState creates (0700) and locks parent/name for a run process. A lock held by another process means
// the sandbox is running; a free one with files in it means an earlier run died, and they are cleaned.
func lockState(parent, name string, log *slog.Logger) (*state, error) {
	dir, err := filepath.Abs(filepath.Join(parent, name))
	if err != nil {
		return nil, err
	}
	// sun_path holds 108 bytes with its terminating NUL.
	if n := len(filepath.Join(dir, controlSocket)); n > 107 {
		return nil, fmt.Errorf("state directory %s is too long for unix sockets in it (%d bytes)", dir, n)
	}
	// QEMU and the handler reach their sockets and files there by path: no one else may be able to
	// plant or swap an entry on the way (safedir.OpenOwned refuses a link, and a directory another user
	// owns or may write in; it creates a missing one 0700).
	for _, p := range []string{filepath.Dir(dir), dir} {
		d, err := safedir.OpenOwned(p)
		if err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		_ = d.Close()
	}
	st, locked, err := tryLock(dir)
	if err != nil {
		return nil, err
	}
	if !locked {
		return nil, fmt.Errorf("sandbox %s is already running (%s is locked)", name, st.path(lockFile))
	}
	if cleaned := cleanStale(dir); len(cleaned) > 0 {
		log.Warn("cleaned up after an earlier run that did not stop", "removed", cleaned)
	}
	return st, nil
}

// tryLock tries to take dir's lock file (api/safedir's lock, never through a link) without waiting. The
// lock file names the process holding it, for Stop to wait for its exit.
func tryLock(dir string) (*state, bool, error) {
	d, err := safedir.Open(dir)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = d.Close() }()
	l, err := d.Lock(lockFile, "crust-microvm")
	if errors.Is(err, safedir.ErrLocked) {
		return &state{dir: dir}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return &state{dir: dir, lock: l}, true, nil
}

// writeNoFollow writes data to the file at path (mode 0600), never through a link at its place.
func writeNoFollow(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

func (s *state) unlock() { s.lock.Release() }

// cleanStale kills a QEMU left by a dead run of this state directory (QEMU normally dies with it) and
// removes the stale files; it returns what it cleaned. The caller holds the lock.
func cleanStale(dir string) []string {
	var cleaned []string
	if pid := KillStaleQEMU(dir, pidFile); pid != 0 {
		cleaned = append(cleaned, "qemu pid "+strconv.Itoa(pid))
	}
	for _, name := range stale {
		if err := os.Remove(filepath.Join(dir, name)); err == nil {
			cleaned = append(cleaned, name)
		}
	}
	return cleaned
}

// KillStaleQEMU kills the QEMU whose pid the file dir/pidFile holds, when it is a live QEMU of dir's (its
// QMP socket is dir/qmp.sock, as package vm makes it), and waits for it to exit; it answers the pid it
// killed, or 0.
func KillStaleQEMU(dir, pidFile string) int {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && killQEMU(pid, dir) {
		return pid
	}
	return 0
}

// killQEMU kills pid when it is a live QEMU of dir's, and waits for it to exit (five seconds at most,
// for a process the kernel cannot reap at once); it reports whether it killed one. The process is held by
// a pidfd from before the check, so a pid reused meanwhile is never signalled.
func killQEMU(pid int, dir string) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false // no such process
	}
	defer func() { _ = unix.Close(fd) }()
	if !isOurQEMU(pid, dir) || unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) != nil {
		return false
	}
	exited := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}} // readable once the process has exited
	for {
		if _, err := unix.Poll(exited, 5000); err != unix.EINTR {
			return true
		}
	}
}

// isOurQEMU reports whether pid is a live QEMU whose command line names dir's QMP socket.
func isOurQEMU(pid int, dir string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), filepath.Join(dir, "qmp.sock")) && alive(pid)
}

// alive reports whether process pid exists and has not exited (a zombie has).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold anything.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}

// lockHolder is the pid a run process wrote in dir's lock file, or 0.
func lockHolder(dir string) int {
	d, err := safedir.Open(dir)
	if err != nil {
		return 0
	}
	defer func() { _ = d.Close() }()
	return d.LockHolder(lockFile)
}
