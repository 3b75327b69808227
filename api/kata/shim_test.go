package kata

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/api/unixsocket"
)

// The record's example answer, byte for byte, and what it decodes to.
const recordExample = `{"usage":[{"available":1032192,"total":1064960,"used":32768,"unit":1},{"available":65525,"total":65536,"used":11,"unit":2}]}`

var recordStats = katatest.VolumeStats{Usage: []katatest.VolumeUsage{
	{Available: 1032192, Total: 1064960, Used: 32768, Unit: 1},
	{Available: 65525, Total: 65536, Used: 11, Unit: 2},
}}

func TestShimSockets(t *testing.T) {
	// The defaults are the record's, in its order (katatest writes them down independently).
	got, err := ShimSockets(nil, "sb1")
	want := []string{katatest.ShimSocket(katatest.GoShimDir, "sb1"), katatest.ShimSocket(katatest.RustShimDir, "sb1")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ShimSockets(nil) = %q, %v; want %q", got, err, want)
	}
	if got, _ := ShimSockets([]string{}, "sb1"); !slices.Equal(got, want) {
		t.Errorf("ShimSockets([]) = %q, want %q", got, want)
	}
	if got, _ := ShimSockets([]string{"/b", "/a"}, "x"); !slices.Equal(got, []string{"/b/x/shim-monitor.sock", "/a/x/shim-monitor.sock"}) {
		t.Errorf("custom dirs: %q", got)
	}
	for _, id := range []string{"", ".", "..", "a/b", "../x", "a\x00b", strings.Repeat("a", 256)} {
		if _, err := ShimSockets(nil, id); !errors.Is(err, ErrInvalidSandboxID) {
			t.Errorf("ShimSockets(%q): %v, want ErrInvalidSandboxID", id, err)
		}
	}
}

// TestShimStatsSocketChoice: the Go runtime's socket first, runtime-rs's when the former does not answer.
func TestShimStatsSocketChoice(t *testing.T) {
	for _, tc := range []struct {
		name        string
		goShim      bool // a live shim at the Go runtime's socket
		staleGo     bool // a socket file at the Go runtime's place that nobody listens on
		rsShim      bool
		wantAnswers string // "go", "rs", or "" for unreachable
	}{
		{name: "go runtime", goShim: true, wantAnswers: "go"},
		{name: "runtime-rs fallback", rsShim: true, wantAnswers: "rs"},
		{name: "both, go first", goShim: true, rsShim: true, wantAnswers: "go"},
		{name: "stale go socket", staleGo: true, rsShim: true, wantAnswers: "rs"},
		{name: "none", wantAnswers: ""},
		{name: "stale only", staleGo: true, wantAnswers: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goDir, rsDir := katatest.ShimDirs(t)
			const id, dev = "sb1", "/dev/vdb"
			answer := func(n uint64) func(string) (*katatest.VolumeStats, error) {
				return func(string) (*katatest.VolumeStats, error) {
					return &katatest.VolumeStats{Usage: []katatest.VolumeUsage{{Total: n, Unit: 1}}}, nil
				}
			}
			var rsShim *katatest.Shim
			if tc.goShim {
				(&katatest.Shim{Stats: answer(1)}).Start(t, katatest.ShimSocket(goDir, id))
			}
			if tc.staleGo {
				staleSocket(t, katatest.ShimSocket(goDir, id))
			}
			if tc.rsShim {
				rsShim = (&katatest.Shim{Stats: answer(2)}).Start(t, katatest.ShimSocket(rsDir, id))
			}
			c := &ShimClient{Dirs: []string{goDir, rsDir}}
			st, err := c.Stats(context.Background(), id, dev)
			var want uint64
			switch tc.wantAnswers {
			case "":
				if !errors.Is(err, ErrShimUnreachable) {
					t.Fatalf("Stats: %v, want ErrShimUnreachable", err)
				}
				for _, s := range []string{katatest.ShimSocket(goDir, id), katatest.ShimSocket(rsDir, id)} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not name %s", err, s)
					}
				}
				return
			case "go":
				want = 1
			case "rs":
				want = 2
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Usage) != 1 || st.Usage[0].Total != want {
				t.Errorf("answered by %+v, want the %s shim", st, tc.wantAnswers)
			}
			if rsShim != nil && tc.wantAnswers == "go" && len(rsShim.Requests()) != 0 {
				t.Errorf("runtime-rs shim asked too: %v", rsShim.Requests())
			}
		})
	}
}

// staleSocket leaves a socket file at path that nobody listens on, as a shim that died does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	_ = l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

// TestShimStatsDecoding: the record's example decodes to its numbers, and absent keys are zeros.
func TestShimStatsDecoding(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   katatest.VolumeStats
		wantBody string
		want     VolumeStats
	}{
		{
			name: "record example", answer: recordStats, wantBody: recordExample,
			want: VolumeStats{Usage: []VolumeUsage{
				{Available: 1032192, Total: 1064960, Used: 32768, Unit: UsageUnitBytes},
				{Available: 65525, Total: 65536, Used: 11, Unit: UsageUnitInodes},
			}},
		},
		{
			name:     "zeros left out",
			answer:   katatest.VolumeStats{Usage: []katatest.VolumeUsage{{Total: 4096, Unit: 1}, {Used: 3}, {}}},
			wantBody: `{"usage":[{"total":4096,"unit":1},{"used":3},{}]}`,
			want:     VolumeStats{Usage: []VolumeUsage{{Total: 4096, Unit: UsageUnitBytes}, {Used: 3}, {}}},
		},
		{name: "nothing", wantBody: `{}`},
		{
			name:     "condition",
			answer:   katatest.VolumeStats{VolumeCondition: &katatest.VolumeCondition{Abnormal: true, Message: "read-only remount"}},
			wantBody: `{"volume_condition":{"abnormal":true,"message":"read-only remount"}}`,
			want:     VolumeStats{VolumeCondition: &VolumeCondition{Abnormal: true, Message: "read-only remount"}},
		},
		{
			name:     "healthy condition is empty",
			answer:   katatest.VolumeStats{VolumeCondition: &katatest.VolumeCondition{}},
			wantBody: `{"volume_condition":{}}`,
			want:     VolumeStats{VolumeCondition: &VolumeCondition{}},
		},
		{
			name:     "largest numbers",
			answer:   katatest.VolumeStats{Usage: []katatest.VolumeUsage{{Available: math.MaxUint64, Total: math.MaxUint64, Used: 1, Unit: 7}}},
			wantBody: `{"usage":[{"available":18446744073709551615,"total":18446744073709551615,"used":1,"unit":7}]}`,
			want:     VolumeStats{Usage: []VolumeUsage{{Available: math.MaxUint64, Total: math.MaxUint64, Used: 1, Unit: 7}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goDir, _ := katatest.ShimDirs(t)
			shim := (&katatest.Shim{Stats: func(string) (*katatest.VolumeStats, error) { return &tc.answer, nil }}).
				Start(t, katatest.ShimSocket(goDir, "sb"))
			// The fake's own bytes, as a raw client sees them.
			if body := rawGet(t, shim.Socket(), "/direct-volume/stats?path=%2Fdev%2Fx"); body != tc.wantBody {
				t.Errorf("fake answered %s, want %s", body, tc.wantBody)
			}
			st, err := (&ShimClient{Dirs: []string{goDir}}).Stats(context.Background(), "sb", "/dev/x")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*st, tc.want) {
				t.Errorf("decoded %+v, want %+v", *st, tc.want)
			}
		})
	}
}

// rawGet sends a GET over the unix socket with nothing but the standard library, and returns the body of a
// 200 answer.
func rawGet(t *testing.T, socket, target string) string {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: shim\r\nConnection: close\r\n\r\n", target); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := conn.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	head, body, ok := strings.Cut(b.String(), "\r\n\r\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.1 200 ") {
		t.Fatalf("answer %q", b.String())
	}
	return body
}

// TestShimStatsEscaping: the device travels as url.PathEscape(device) in the path query parameter, byte
// for byte, and a shim that reads it as Kata does gets the device back.
func TestShimStatsEscaping(t *testing.T) {
	for _, tc := range []struct {
		device, rawQuery string
		roundTrips       bool // Kata's shim reads the device back unchanged
	}{
		{"/dev/loop0", "path=%2Fdev%2Floop0", true},
		{"/dev/disk/by-id/nvme-Samsung SSD_970:1", "path=%2Fdev%2Fdisk%2Fby-id%2Fnvme-Samsung%20SSD_970:1", true},
		{"/dev/a?b#c", "path=%2Fdev%2Fa%3Fb%23c", true},
		{"/dev/a;b,c", "path=%2Fdev%2Fa%3Bb%2Cc", true},
		{`/dev/disk/by-label/x\x20y`, "path=%2Fdev%2Fdisk%2Fby-label%2Fx%5Cx20y", true},
		{"/dev/ü", "path=%2Fdev%2F%C3%BC", true},
		{"/dev/a@b=c$d", "path=%2Fdev%2Fa@b=c$d", true},
		// url.PathEscape leaves '+' and '&' alone and Kata decodes the query first: its shim reads another
		// device. crust sends what the record says, as kata-runtime does.
		{"/dev/a+b", "path=%2Fdev%2Fa+b", false},
		{"/dev/a&b", "path=%2Fdev%2Fa&b", false},
		{"/dev/a%41", "path=%2Fdev%2Fa%2541", false},
	} {
		t.Run(tc.device, func(t *testing.T) {
			goDir, _ := katatest.ShimDirs(t)
			var seen []string
			shim := (&katatest.Shim{Stats: func(device string) (*katatest.VolumeStats, error) {
				seen = append(seen, device)
				if device != tc.device {
					return nil, fmt.Errorf("no volume with device %s", device)
				}
				return &recordStats, nil
			}}).Start(t, katatest.ShimSocket(goDir, "sb"))
			_, err := (&ShimClient{Dirs: []string{goDir}}).Stats(context.Background(), "sb", tc.device)
			reqs := shim.Requests()
			if len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Path != "/direct-volume/stats" ||
				reqs[0].RawQuery != tc.rawQuery || reqs[0].RawQuery != "path="+url.PathEscape(tc.device) {
				t.Fatalf("requests %+v, want GET /direct-volume/stats?%s", reqs, tc.rawQuery)
			}
			if tc.roundTrips {
				if err != nil || !slices.Equal(seen, []string{tc.device}) {
					t.Errorf("Stats: %v; shim read %q", err, seen)
				}
				return
			}
			var se *ShimError
			if !errors.As(err, &se) || se.Status != 500 {
				t.Errorf("Stats: %v, want the shim's 500 (it read %q)", err, seen)
			}
		})
	}
}

// TestShimErrors: non-200 answers are *ShimError with the status and the shim's text.
func TestShimErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stats      func(string) (*katatest.VolumeStats, error)
		resizeFn   func(string, uint64) error
		postOnly   bool
		device     string
		resize     bool
		wantStatus int
		wantBody   string
	}{
		{name: "missing path", device: "", wantStatus: 400, wantBody: `query parameter "path" is required`},
		{
			name:   "stats failure",
			stats:  func(string) (*katatest.VolumeStats, error) { return nil, errors.New("guest: statfs failed") },
			device: "/dev/x", wantStatus: 500, wantBody: "guest: statfs failed",
		},
		{name: "unknown device", device: "/dev/none", wantStatus: 500, wantBody: "volume with device /dev/none is not in this sandbox"},
		{
			name:     "runtime-rs stats failure, asked again by POST",
			stats:    func(string) (*katatest.VolumeStats, error) { return nil, errors.New("guest: statfs failed") },
			postOnly: true, device: "/dev/x", wantStatus: 500, wantBody: "guest: statfs failed",
		},
		{name: "resize unimplemented", device: "/dev/x", resize: true, wantStatus: 500, wantBody: katatest.UnimplementedText},
		{
			name:     "resize failure",
			resizeFn: func(string, uint64) error { return errors.New("no space") },
			device:   "/dev/x", resize: true, wantStatus: 500, wantBody: "no space",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goDir, _ := katatest.ShimDirs(t)
			(&katatest.Shim{Stats: tc.stats, Resize: tc.resizeFn, StatsPostOnly: tc.postOnly}).
				Start(t, katatest.ShimSocket(goDir, "sb"))
			c := &ShimClient{Dirs: []string{goDir}}
			var err error
			if tc.resize {
				err = c.Resize(context.Background(), "sb", tc.device, 1<<30)
			} else {
				_, err = c.Stats(context.Background(), "sb", tc.device)
			}
			var se *ShimError
			if !errors.As(err, &se) || se.Status != tc.wantStatus || se.Body != tc.wantBody {
				t.Fatalf("err = %v (%#v), want status %d body %q", err, se, tc.wantStatus, tc.wantBody)
			}
			if errors.Is(err, ErrShimUnreachable) || !strings.Contains(err.Error(), tc.wantBody) ||
				!strings.Contains(err.Error(), fmt.Sprint(tc.wantStatus)) {
				t.Errorf("message %q", err)
			}
		})
	}
}

// TestShimStatsRuntimeRs: a shim that answers a stats GET with 404 (runtime-rs matches only POST) is
// asked again by POST with the same query and no body, and its numbers are the answer; a shim that
// serves GET is asked once.
func TestShimStatsRuntimeRs(t *testing.T) {
	for _, postOnly := range []bool{true, false} {
		t.Run(fmt.Sprintf("post only %t", postOnly), func(t *testing.T) {
			_, rsDir := katatest.ShimDirs(t)
			shim := (&katatest.Shim{StatsPostOnly: postOnly, Stats: func(string) (*katatest.VolumeStats, error) {
				return &recordStats, nil
			}}).Start(t, katatest.ShimSocket(rsDir, "sb"))
			st, err := (&ShimClient{Dirs: []string{rsDir}}).Stats(context.Background(), "sb", "/dev/vd b")
			if err != nil {
				t.Fatal(err)
			}
			if st.Usage[0].Total != 1064960 || st.Usage[1].Used != 11 {
				t.Fatalf("stats %+v", st)
			}
			want := []katatest.ShimRequest{{Method: "GET", Path: katatest.StatsPath, RawQuery: "path=%2Fdev%2Fvd%20b", Body: []byte{}}}
			if postOnly {
				want = append(want, katatest.ShimRequest{Method: "POST", Path: katatest.StatsPath, RawQuery: "path=%2Fdev%2Fvd%20b", Body: []byte{}})
			}
			if got := shim.Requests(); !reflect.DeepEqual(got, want) {
				t.Fatalf("requests %+v, want %+v", got, want)
			}
		})
	}
}

// TestShimResize: the body is exactly {"VolumePath":"<device>","Size":<n>}, POSTed, and 200 is success.
func TestShimResize(t *testing.T) {
	for _, tc := range []struct {
		device string
		size   uint64
		body   string
	}{
		{"/dev/loop3", 1 << 30, `{"VolumePath":"/dev/loop3","Size":1073741824}`},
		{`/dev/a "b" <c>&`, math.MaxUint64, `{"VolumePath":"/dev/a \"b\" \u003cc\u003e\u0026","Size":18446744073709551615}`},
		{"/dev/x", 0, `{"VolumePath":"/dev/x","Size":0}`},
	} {
		t.Run(tc.device, func(t *testing.T) {
			_, rsDir := katatest.ShimDirs(t)
			type got struct {
				device string
				size   uint64
			}
			var calls []got
			shim := (&katatest.Shim{Resize: func(device string, size uint64) error {
				calls = append(calls, got{device, size})
				return nil
			}}).Start(t, katatest.ShimSocket(rsDir, "sb"))
			// The runtime-rs place: found after the missing Go-runtime socket.
			c := &ShimClient{Dirs: []string{filepath.Join(filepath.Dir(rsDir), "sbs"), rsDir}}
			if err := c.Resize(context.Background(), "sb", tc.device, tc.size); err != nil {
				t.Fatal(err)
			}
			reqs := shim.Requests()
			if len(reqs) != 1 || reqs[0].Method != "POST" || reqs[0].Path != "/direct-volume/resize" ||
				reqs[0].RawQuery != "" || string(reqs[0].Body) != tc.body {
				t.Fatalf("requests %+v, want POST /direct-volume/resize %s", reqs, tc.body)
			}
			if !slices.Equal(calls, []got{{tc.device, tc.size}}) {
				t.Errorf("shim resized %v", calls)
			}
		})
	}
}

// TestShimContext: a shim that does not answer in time gives the context's error, not ErrShimUnreachable.
func TestShimContext(t *testing.T) {
	goDir, _ := katatest.ShimDirs(t)
	release := make(chan struct{})
	defer close(release)
	(&katatest.Shim{Stats: func(string) (*katatest.VolumeStats, error) {
		<-release
		return nil, nil
	}}).Start(t, katatest.ShimSocket(goDir, "sb"))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := (&ShimClient{Dirs: []string{goDir}}).Stats(ctx, "sb", "/dev/x")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrShimUnreachable) {
		t.Fatalf("Stats: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
	// An already ended context does not dial.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := (&ShimClient{Dirs: []string{goDir}}).Resize(ctx, "sb", "/dev/x", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Resize: %v, want Canceled", err)
	}
}

// TestShimUndecodable: a 200 whose body is not the stats is an error that is neither kind.
func TestShimUndecodable(t *testing.T) {
	goDir, _ := katatest.ShimDirs(t)
	l, err := unixsocket.Listen(katatest.ShimSocket(goDir, "sb"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			_, _ = conn.Read(buf)
			_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot json!"))
			_ = conn.Close()
		}
	}()
	_, err = (&ShimClient{Dirs: []string{goDir}}).Stats(context.Background(), "sb", "/dev/x")
	var se *ShimError
	if err == nil || errors.As(err, &se) || errors.Is(err, ErrShimUnreachable) || !strings.Contains(err.Error(), "not json!") {
		t.Fatalf("Stats: %v", err)
	}
}
