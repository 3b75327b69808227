package katatest

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestShimWire checks the fake against the record with a plain HTTP client, independently of crust's.
func TestShimWire(t *testing.T) {
	root, err := os.MkdirTemp("", "ks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	stats := func(device string) (*VolumeStats, error) {
		if device != "/dev/vd b" {
			return nil, io.ErrUnexpectedEOF
		}
		return &VolumeStats{Usage: []VolumeUsage{
			{Available: 1032192, Total: 1064960, Used: 32768, Unit: 1},
			{Available: 65525, Total: 65536, Used: 11, Unit: 2},
		}}, nil
	}
	goShim := (&Shim{Stats: stats}).Start(t, ShimSocket(filepath.Join(root, "go"), "sb"))
	rsShim := (&Shim{Stats: stats, StatsPostOnly: true}).Start(t, ShimSocket(filepath.Join(root, "rs"), "sb"))

	for _, tc := range []struct {
		name         string
		shim         *Shim
		method, url  string
		body         string
		status       int
		answer       string
		answerPrefix bool
	}{
		{"stats", goShim, "GET", "/direct-volume/stats?path=%2Fdev%2Fvd%20b", "", 200,
			`{"usage":[{"available":1032192,"total":1064960,"used":32768,"unit":1},{"available":65525,"total":65536,"used":11,"unit":2}]}`, false},
		{"no path", goShim, "GET", "/direct-volume/stats", "", 400, `query parameter "path" is required`, false},
		{"empty path", goShim, "GET", "/direct-volume/stats?path=", "", 400, `query parameter "path" is required`, false},
		{"failure", goShim, "GET", "/direct-volume/stats?path=%2Fdev%2Fother", "", 500, io.ErrUnexpectedEOF.Error(), false},
		{"bad escape", goShim, "GET", "/direct-volume/stats?path=%25zz", "", 500, "invalid URL escape", true},
		{"stats by POST on the go runtime", goShim, "POST", "/direct-volume/stats?path=%2Fdev%2Fvd%20b", "", 405, "", true},
		{"runtime-rs GET", rsShim, "GET", "/direct-volume/stats?path=%2Fdev%2Fvd%20b", "", 404, "", true},
		{"runtime-rs POST", rsShim, "POST", "/direct-volume/stats?path=%2Fdev%2Fvd%20b", "", 200, `{"usage":[`, true},
		{"resize", goShim, "POST", "/direct-volume/resize", `{"VolumePath":"/dev/vd b","Size":4096}`, 500, UnimplementedText, false},
		{"resize bad body", goShim, "POST", "/direct-volume/resize", `{"Size":-1}`, 500, "json: ", true},
		{"resize by GET", goShim, "GET", "/direct-volume/resize", "", 405, "", true},
		{"other path", goShim, "GET", "/metrics", "", 404, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", tc.shim.Socket())
			}}}
			req, err := http.NewRequest(tc.method, "http://shim"+tc.url, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			ok := string(b) == tc.answer
			if tc.answerPrefix {
				ok = strings.Contains(string(b), tc.answer) && len(b) > 0
			}
			if resp.StatusCode != tc.status || !ok {
				t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.url, resp.StatusCode, b, tc.status, tc.answer)
			}
		})
	}

	// A successful resize is 200 with an empty body.
	okShim := (&Shim{Resize: func(string, uint64) error { return nil }}).Start(t, ShimSocket(filepath.Join(root, "ok"), "sb"))
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", okShim.Socket())
	}}}
	resp, err := c.Post("http://shim/direct-volume/resize", "application/json", strings.NewReader(`{"VolumePath":"/dev/x","Size":1}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || len(b) != 0 {
		t.Errorf("resize: %d %q", resp.StatusCode, b)
	}
	// Close makes it unreachable.
	okShim.Close()
	if _, err := os.Stat(okShim.Socket()); !os.IsNotExist(err) {
		t.Errorf("socket left after Close: %v", err)
	}
	okShim.Close()
}
