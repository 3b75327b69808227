package validate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"crust.dev/crust/api/errdefs"
)

// HandlerSockets checks, at claim time, that crustd can reach the socket of a runtime handler's endpoint:
// crustd dials it from its own mount namespace (in a pod, it sees only the host directories the pod
// mounts), and a socket it cannot see would be taken, after the grace period, for a handler that is gone,
// its claims released and taken again over and over. It is the manager's HandlerSockets.
type HandlerSockets struct {
	// Dirs are where handlers keep their sockets so that crustd sees them, named in a refusal (crustd
	// names the handlers/ directory beside its own socket); empty: none named.
	Dirs []string
}

// Reachable returns nil when crustd sees a unix socket at the path of ep, an endpoint HandlerEndpoint
// accepted; "" (no endpoint) is nil too. It only looks (stat(2), through symbolic links as a dial goes):
// whether a handler answers there is not asked, so a handler may claim before it serves. Otherwise it
// returns an error of kind errdefs.ErrFailedPrecondition that names the path, what crustd found there,
// and where a handler's socket must lie.
func (h HandlerSockets) Reachable(ep string) error {
	if ep == "" {
		return nil
	}
	path := EndpointPath(ep)
	fi, err := os.Stat(path)
	var found string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		found = "there is no such file in crustd's view of the host (its mount namespace: in a pod, only the " +
			"host directories the pod mounts)"
	case err != nil:
		found = fmt.Sprintf("crustd cannot look at it: %v", err)
	case fi.Mode().Type() != fs.ModeSocket:
		found = fmt.Sprintf("it is a %s, not a socket", fileType(fi.Mode()))
	default:
		return nil
	}
	where := "in a host directory that crustd's pod mounts"
	if len(h.Dirs) > 0 {
		where = "in " + strings.Join(h.Dirs, " or ") + ", or in another host directory that crustd's pod mounts"
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition,
		"handler_endpoint %q: crustd cannot reach the socket %s: %s; crustd could never forward stats or expansion "+
			"to the handler, and would take it for gone. A handler's socket must lie where crustd sees it: %s "+
			"(see docs/runtime-authors.md)", ep, path, found, where)
}

// EndpointPath returns the socket path of a handler endpoint HandlerEndpoint accepted (unix:///path or
// unix:/path), or "" for an empty one.
func EndpointPath(ep string) string {
	rest, _ := strings.CutPrefix(ep, "unix:")
	if p, ok := strings.CutPrefix(rest, "//"); ok {
		return p
	}
	return rest
}

// fileType names the type of a file that is not a socket.
func fileType(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "regular file"
	case fs.ModeDir:
		return "directory"
	case fs.ModeNamedPipe:
		return "named pipe"
	case fs.ModeDevice:
		return "block device"
	case fs.ModeDevice | fs.ModeCharDevice:
		return "character device"
	}
	return "file of type " + m.Type().String()
}
