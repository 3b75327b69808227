// Package unixsocket creates the unix sockets crust's programs serve on: crustd's API, the CSI proxy's
// socket, a runtime handler's socket. It is public so that runtime handlers written elsewhere serve theirs
// the same way.
package unixsocket

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

var umaskMu sync.Mutex

// Listen creates a unix socket at path (a path, or a unix:// or unix: address) with mode 0600, set through
// the umask so the socket never exists with a wider mode, and creates missing parent directories (0755).
// A stale socket that nothing answers on is replaced; a live one, or a file at path that is not a socket,
// is an error and is left alone. Closing the listener removes the socket.
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
	// The umask is process-wide; hold it only around the bind.
	umaskMu.Lock()
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	return l, nil
}
