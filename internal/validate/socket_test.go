package validate

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/api/errdefs"
)

// TestHandlerSockets: an endpoint is reachable when a socket is at its path (through a link, as a dial
// goes), or when there is none; anything else is FailedPrecondition naming the path, what is there and
// where sockets go.
func TestHandlerSockets(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "h.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	h := HandlerSockets{Dirs: []string{"/run/crust/handlers"}}
	for _, ep := range []string{"", "unix://" + sock, "unix:" + sock, "unix://" + link} {
		if err := h.Reachable(ep); err != nil {
			t.Errorf("%q: %v", ep, err)
		}
	}
	for ep, found := range map[string]string{
		"unix://" + filepath.Join(dir, "none", "h.sock"): "no such file in crustd's view",
		"unix://" + file: "regular file, not a socket",
		"unix://" + dir:  "directory, not a socket",
	} {
		err := h.Reachable(ep)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), EndpointPath(ep)) ||
			!strings.Contains(err.Error(), found) || !strings.Contains(err.Error(), "/run/crust/handlers") {
			t.Errorf("%q: %v; want FailedPrecondition naming the path, %q and where sockets go", ep, err, found)
		}
	}
}
