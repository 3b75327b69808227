package kata

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"crust.dev/crust/api/errdefs"
)

// Where a Kata shim serves its management API: HTTP over the unix socket
// <dir>/<sandbox id>/ShimSocketName, for dir in DefaultShimDirs.
const (
	// GoShimDir is where Kata's Go runtime puts one directory per sandbox.
	GoShimDir = "/run/vc/sbs"
	// RustShimDir is where Kata's runtime-rs puts one directory per sandbox.
	RustShimDir = "/run/kata"
	// ShimSocketName is the name of the management socket inside a sandbox's directory.
	ShimSocketName = "shim-monitor.sock"
)

// The direct-volume part of the shim's management API.
const (
	// StatsURLPath answers GET with the stats of the volume whose device is in the query parameter
	// PathQueryKey.
	StatsURLPath = "/direct-volume/stats"
	// ResizeURLPath takes a POST whose body is a JSON ResizeRequest.
	ResizeURLPath = "/direct-volume/resize"
	// PathQueryKey is the query parameter of StatsURLPath that holds url.PathEscape(device).
	PathQueryKey = "path"
)

// maxShimBody bounds how much of a shim's answer is read.
const maxShimBody = 1 << 20

// DefaultShimDirs returns the directories a shim's socket is looked for in, in the order Kata's own
// client tries them: the Go runtime's, then runtime-rs's.
func DefaultShimDirs() []string { return []string{GoShimDir, RustShimDir} }

// ShimSockets returns the management sockets a shim of sandboxID may listen on, one per dir in order:
// <dir>/<sandboxID>/shim-monitor.sock. Empty dirs means DefaultShimDirs. A sandboxID that is not a plain
// file name (empty, ".", "..", or holding '/' or NUL) is ErrInvalidSandboxID, so a socket path never
// leaves its directory.
func ShimSockets(dirs []string, sandboxID string) ([]string, error) {
	if sandboxID == "" || sandboxID == "." || sandboxID == ".." || strings.ContainsAny(sandboxID, "/\x00") ||
		len(sandboxID) > maxNameLen {
		return nil, fmt.Errorf("%w: %q", ErrInvalidSandboxID, sandboxID)
	}
	if len(dirs) == 0 {
		dirs = DefaultShimDirs()
	}
	socks := make([]string, len(dirs))
	for i, d := range dirs {
		socks[i] = filepath.Join(d, sandboxID, ShimSocketName)
	}
	return socks, nil
}

// VolumeStats is what a shim answers to a stats request: the usage and condition of the volume as its
// guest sees them. Its encoding/json output is what the shim sends for the same values: keys of zero
// values are left out, and a reader takes an absent key for zero.
type VolumeStats struct {
	// Usage has one entry per unit, usually bytes and inodes.
	Usage []VolumeUsage `json:"usage,omitempty"`
	// VolumeCondition is the volume's health, or nil when the shim sent none.
	VolumeCondition *VolumeCondition `json:"volume_condition,omitempty"`
}

// VolumeUsage is one line of usage, counted in Unit.
type VolumeUsage struct {
	Available uint64    `json:"available,omitempty"`
	Total     uint64    `json:"total,omitempty"`
	Used      uint64    `json:"used,omitempty"`
	Unit      UsageUnit `json:"unit,omitempty"`
}

// UsageUnit says what a VolumeUsage counts. It travels as a JSON number.
type UsageUnit int32

// Values of UsageUnit. Other numbers may arrive; they count something this package does not know.
const (
	UsageUnitUnknown UsageUnit = 0
	UsageUnitBytes   UsageUnit = 1
	UsageUnitInodes  UsageUnit = 2
)

// VolumeCondition is a volume's health as its guest sees it.
type VolumeCondition struct {
	// Abnormal is true when the volume is not healthy.
	Abnormal bool `json:"abnormal,omitempty"`
	// Message says what is wrong.
	Message string `json:"message,omitempty"`
}

// ResizeRequest is the body of a resize request. It has no JSON tags on purpose: the shim expects the
// field names as keys, so it encodes as {"VolumePath":"<device>","Size":<bytes>}.
type ResizeRequest struct {
	// VolumePath is the host device path of the volume (MountInfo.Device), not the volume path.
	VolumePath string
	// Size is the size wanted, in bytes.
	Size uint64
}

// ErrShimUnreachable is returned when none of a sandbox's management sockets accepts a connection, or
// when the shim that accepted one closed it without answering.
var ErrShimUnreachable = errdefs.New(errdefs.ErrUnavailable, "kata shim unreachable")

// ShimError is a shim's answer other than 200 OK. Body is the shim's own text (Kata puts its error
// message there), at most 1 MiB of it.
type ShimError struct {
	// Status is the HTTP status code, such as 400 for a missing path or 500 for a failure.
	Status int
	// Body is the text the shim sent with it.
	Body string
}

// Error says the status and the shim's text.
func (e *ShimError) Error() string {
	msg := fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
	if b := strings.TrimSpace(e.Body); b != "" {
		msg += ": " + b
	}
	return msg
}

// ShimClient talks to Kata shims' management sockets about direct-assigned volumes, the way
// `kata-runtime direct-volume stats|resize` does. The zero value looks in DefaultShimDirs. A ShimClient
// holds no connection: every call dials, sends one request and closes, so it may be used concurrently.
//
// Every call tries the sockets of ShimSockets in order and uses the first that accepts a connection, so
// a Go-runtime socket left behind by a dead shim does not hide a runtime-rs one. Its errors are:
// ErrInvalidSandboxID for a bad sandbox id; ErrShimUnreachable (wrapped, naming each socket and why)
// when no shim answers; the context's error when ctx ends first; a *ShimError (wrapped) for an answer
// other than 200; and a plain error for a 200 answer that does not decode.
type ShimClient struct {
	// Dirs are the directories that hold one directory per sandbox, in the order they are tried; empty
	// means DefaultShimDirs.
	Dirs []string
}

// Stats asks the shim of sandboxID for the stats of the volume whose host device is device (the Device
// of its mountInfo.json): GET StatsURLPath?path=<url.PathEscape(device)>. A shim that answers that with
// 404 or 405 is asked again with POST, the same query and no body: runtime-rs serves stats on POST only.
// Numbers the shim leaves out are zero.
func (c *ShimClient) Stats(ctx context.Context, sandboxID, device string) (*VolumeStats, error) {
	target := StatsURLPath + "?" + PathQueryKey + "=" + url.PathEscape(device)
	body, sock, err := c.do(ctx, sandboxID, http.MethodGet, target, nil)
	if se := (*ShimError)(nil); errors.As(err, &se) && (se.Status == http.StatusNotFound || se.Status == http.StatusMethodNotAllowed) {
		body, sock, err = c.do(ctx, sandboxID, http.MethodPost, target, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("kata shim of sandbox %q: stats of %s: %w", sandboxID, device, err)
	}
	var st VolumeStats
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("kata shim of sandbox %q at %s: stats of %s: undecodable answer %q: %v",
			sandboxID, sock, device, truncate(body), err)
	}
	return &st, nil
}

// Resize asks the shim of sandboxID to grow the volume whose host device is device to size bytes: POST
// ResizeURLPath with the ResizeRequest as body. A shim answers 200 with an empty body on success. Note
// that Kata's guest agent does not implement resizing today, so a real Kata shim answers every resize
// with a *ShimError of status 500 saying so.
func (c *ShimClient) Resize(ctx context.Context, sandboxID, device string, size uint64) error {
	body, err := json.Marshal(ResizeRequest{VolumePath: device, Size: size})
	if err != nil {
		return err
	}
	if _, _, err := c.do(ctx, sandboxID, http.MethodPost, ResizeURLPath, body); err != nil {
		return fmt.Errorf("kata shim of sandbox %q: resize of %s to %d bytes: %w", sandboxID, device, size, err)
	}
	return nil
}

// do sends one request to the first socket of sandboxID that answers and returns the body of a 200
// answer and the socket used.
func (c *ShimClient) do(ctx context.Context, sandboxID, method, target string, body []byte) ([]byte, string, error) {
	socks, err := ShimSockets(c.Dirs, sandboxID)
	if err != nil {
		return nil, "", err
	}
	conn, sock, err := dialFirst(ctx, socks)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = conn.Close() }()
	// Unblock reads and writes when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://shim"+target, rd)
	if err != nil {
		return nil, sock, err
	}
	req.Close = true // one request per connection
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	fail := func(err error) ([]byte, string, error) {
		if ctx.Err() != nil {
			return nil, sock, ctx.Err()
		}
		return nil, sock, fmt.Errorf("%s: no answer: %v: %w", sock, err, ErrShimUnreachable)
	}
	if err := req.Write(conn); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxShimBody+1))
	if err != nil {
		return fail(err)
	}
	if resp.StatusCode != http.StatusOK {
		if len(data) > maxShimBody {
			data = data[:maxShimBody]
		}
		return nil, sock, fmt.Errorf("%s: %w", sock, &ShimError{Status: resp.StatusCode, Body: string(data)})
	}
	if len(data) > maxShimBody {
		return nil, sock, fmt.Errorf("%s: answer longer than %d bytes", sock, maxShimBody)
	}
	return data, sock, nil
}

// dialFirst connects to the first of socks that accepts a connection.
func dialFirst(ctx context.Context, socks []string) (net.Conn, string, error) {
	var d net.Dialer
	var why []string
	for _, s := range socks {
		conn, err := d.DialContext(ctx, "unix", s)
		if err == nil {
			return conn, s, nil
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		why = append(why, err.Error())
	}
	return nil, "", fmt.Errorf("no management socket answers (%s): %w", strings.Join(why, "; "), ErrShimUnreachable)
}

// truncate shortens an undecodable answer for an error message.
func truncate(b []byte) string {
	const limit = 256
	if len(b) > limit {
		return string(b[:limit]) + "..."
	}
	return string(b)
}
