// Package unixsocket creates the unix sockets crust's programs serve on: crustd's API, the CSI proxy's
// socket, a runtime handler's socket. It is public so that runtime handlers written elsewhere serve theirs
// the same way.
//
// The socket is created with mode 0600 without touching the process's umask (which is process-wide, and
// would race with every goroutine creating files): the mode is set on the socket before it is bound, and
// Linux creates the socket file with that mode, narrowed by the umask; a narrower result is widened back
// to 0600 after the bind. So the socket never exists with a mode wider than 0600.
package unixsocket

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// mode is the mode of every socket Listen creates.
const mode = 0o600

// Listen creates a unix socket at path (a path, or a unix:// or unix: address) with mode 0600, which it
// never exists wider than, and creates missing parent directories (0755). A stale socket that nothing
// answers on is replaced; a live one, or a file at path that is not a socket, is an error and is left
// alone. Closing the listener removes the socket. Listen does not change the process's umask.
func Listen(path string) (net.Listener, error) {
	path = strings.TrimPrefix(strings.TrimPrefix(path, "unix://"), "unix:")
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; refusing to replace it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("%s: something is serving on it already", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	l, err := bind(path)
	if err != nil {
		return nil, err
	}
	// The umask may have narrowed the mode (never widened it): make it exactly 0600.
	if err := os.Chmod(path, mode); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

// bind creates the socket at path with mode 0600 narrowed by the umask: the mode is set on the socket
// before the bind, and the bind creates the file with it.
func bind(path string) (*net.UnixListener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.Fchmod(int(fd), mode) }); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("set the socket's mode before bind: %w", err)
		}
		return nil
	}}
	l, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(true)
	return ul, nil
}
