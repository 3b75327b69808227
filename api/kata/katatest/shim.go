package katatest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"crust.dev/crust/api/unixsocket"
)

// The shim facts below are written down here a second time, from the record, rather than taken from
// crust.dev/crust/api/kata, so that a mistake in that package's client shows up against this fake.
const (
	// GoShimDir is the Go runtime's directory of sandboxes.
	GoShimDir = "/run/vc/sbs"
	// RustShimDir is runtime-rs's directory of sandboxes.
	RustShimDir = "/run/kata"
	// ShimSocketName is the management socket's name inside a sandbox's directory.
	ShimSocketName = "shim-monitor.sock"
	// StatsPath and ResizePath are the direct-volume endpoints.
	StatsPath  = "/direct-volume/stats"
	ResizePath = "/direct-volume/resize"
	// UnimplementedText is what Shim answers, with status 500, to a resize when Resize is nil: the text of
	// the UNIMPLEMENTED error a real Kata shim passes on from its guest agent.
	UnimplementedText = "rpc error: code = Unimplemented desc = the guest agent does not implement ResizeVolume"
)

// ShimSocket returns the management socket of sandboxID under dir (GoShimDir, RustShimDir, or a test's
// stand-in for them).
func ShimSocket(dir, sandboxID string) string {
	return filepath.Join(dir, sandboxID, ShimSocketName)
}

// VolumeStats is the body of a 200 answer to a stats request, with the record's JSON keys; encoding/json
// leaves out every zero number, as the shim does.
type VolumeStats struct {
	Usage           []VolumeUsage    `json:"usage,omitempty"`
	VolumeCondition *VolumeCondition `json:"volume_condition,omitempty"`
}

// VolumeUsage is one usage entry. Unit is 0 (unknown), 1 (bytes) or 2 (inodes).
type VolumeUsage struct {
	Available uint64 `json:"available,omitempty"`
	Total     uint64 `json:"total,omitempty"`
	Used      uint64 `json:"used,omitempty"`
	Unit      int32  `json:"unit,omitempty"`
}

// VolumeCondition is the volume's health.
type VolumeCondition struct {
	Abnormal bool   `json:"abnormal,omitempty"`
	Message  string `json:"message,omitempty"`
}

// ShimRequest is one request as the shim received it, for tests to check the exact wire form.
type ShimRequest struct {
	Method   string
	Path     string
	RawQuery string
	Body     []byte
}

// Shim is a stand-in for a Kata shim's management server, serving the direct-volume part of its API on a
// unix socket exactly as shared/compat/kata-shim-monitor.md records it (the record of Kata's shim
// management API kept next to crust's repository):
//
//   - stats: GET /direct-volume/stats?path=<url.PathEscape(device)>. A missing or empty path is 400 with a
//     text body; a path that does not unescape, or an error from Stats, is 500 with the error's text;
//     otherwise 200 with the encoding/json of the VolumeStats, whose zero numbers are left out. The device
//     is read back the way Kata's Go shim reads it: the query is decoded, then url.PathUnescape'd.
//   - resize: POST /direct-volume/resize with the body {"VolumePath":"<device>","Size":<bytes>}. A body
//     that does not decode, or an error from Resize, is 500 with the error's text; success is 200 with an
//     empty body. With Resize nil every resize is 500 with UnimplementedText, as a real Kata answers today.
//   - with StatsPostOnly, stats answers POST only, as runtime-rs does (the record's known incompatibility),
//     and a GET of it is 404.
//
// Beyond the record, it refuses a method the record does not name for an endpoint (405) and any other
// path (404), so that a client straying from the record fails here; both come with a text body.
//
// Set the fields before Start; they are not changed after.
type Shim struct {
	// Stats answers for device; an error is sent as a 500 with its text. Nil answers 500 for every device.
	Stats func(device string) (*VolumeStats, error)
	// Resize grows device to size bytes; an error is sent as a 500 with its text. Nil answers 500 with
	// UnimplementedText.
	Resize func(device string, size uint64) error
	// StatsPostOnly mimics runtime-rs: stats only on POST.
	StatsPostOnly bool

	mu     sync.Mutex
	reqs   []ShimRequest
	socket string
	srv    *http.Server
	done   chan struct{}
}

// ShimDirs returns stand-ins for GoShimDir and RustShimDir under a new short directory removed when the
// test ends (a unix socket path must fit in 107 bytes); the two are not made, Start makes them.
func ShimDirs(t testing.TB) (goDir, rsDir string) {
	t.Helper()
	root, err := os.MkdirTemp("", "crust") // short: t.TempDir() may not fit a socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	return filepath.Join(root, "sbs"), filepath.Join(root, "kata")
}

// Start serves on socket, creating its directory (mode 0700) when missing, until Close or the end of the
// test. The socket path must fit in a unix socket address (107 bytes).
func (s *Shim) Start(t testing.TB, socket string) *Shim {
	t.Helper()
	l, err := unixsocket.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	s.socket = socket
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(l)
	}()
	t.Cleanup(s.Close)
	return s
}

// Socket returns the socket Start serves on.
func (s *Shim) Socket() string { return s.socket }

// Close stops serving and removes the socket, so the shim is unreachable. Closing again does nothing.
func (s *Shim) Close() {
	if s.srv == nil {
		return
	}
	_ = s.srv.Close()
	<-s.done
	_ = os.Remove(s.socket)
}

// Requests returns every request received so far, in order.
func (s *Shim) Requests() []ShimRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

func (s *Shim) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, ShimRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Body: body})
	s.mu.Unlock()
	if err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	switch r.URL.Path {
	case StatsPath:
		switch {
		case s.StatsPostOnly && r.Method != http.MethodPost:
			text(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
		case !s.StatsPostOnly && r.Method != http.MethodGet:
			text(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s takes GET, not %s", StatsPath, r.Method))
		default:
			s.stats(w, r)
		}
	case ResizePath:
		if r.Method != http.MethodPost {
			text(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s takes POST, not %s", ResizePath, r.Method))
			return
		}
		s.resize(w, body)
	default:
		text(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	}
}

func (s *Shim) stats(w http.ResponseWriter, r *http.Request) {
	val := r.URL.Query().Get("path")
	if val == "" {
		text(w, http.StatusBadRequest, `query parameter "path" is required`)
		return
	}
	device, err := url.PathUnescape(val)
	if err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	st, err := (*VolumeStats)(nil), fmt.Errorf("volume with device %s is not in this sandbox", device)
	if s.Stats != nil {
		st, err = s.Stats(device)
	}
	if err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	if st == nil {
		st = &VolumeStats{}
	}
	b, err := json.Marshal(st)
	if err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	_, _ = w.Write(b)
}

func (s *Shim) resize(w http.ResponseWriter, body []byte) {
	var req struct {
		VolumePath string
		Size       uint64
	}
	if err := json.Unmarshal(body, &req); err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	err := errors.New(UnimplementedText)
	if s.Resize != nil {
		err = s.Resize(req.VolumePath, req.Size)
	}
	if err != nil {
		text(w, http.StatusInternalServerError, err.Error())
		return
	}
	_, _ = w.Write(nil)
}

func text(w http.ResponseWriter, status int, msg string) {
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}
