package metrics

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	certutil "k8s.io/client-go/util/cert"

	"crust.dev/crust/internal/metrics/guard"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
)

// A claimed volume is counted once, under claimed, so that sum(crust_volumes) is the number held.
func TestVolumeGaugesCountEachVolumeOnce(t *testing.T) {
	m := New()
	m.VolumeGauges(func() (held, claimed int) { return 5, 2 })
	want := `
# HELP crust_volumes Descriptors held, by state: staged (no sandbox claims it) or claimed; each is counted once.
# TYPE crust_volumes gauge
crust_volumes{state="claimed"} 2
crust_volumes{state="staged"} 3
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "crust_volumes"); err != nil {
		t.Fatal(err)
	}
}

// The dashboard, the alerts and the alerts' tests in deploy/monitoring name only metrics crustd and the
// proxy export, and the dashboard shows every crust_ metric they export.
func TestShippedQueriesNameExportedMetrics(t *testing.T) {
	m := New()
	m.VolumeGauges(func() (int, int) { return 1, 0 })
	m.QuarantineGauge(func() map[string]int { return map[string]int{"corrupt_record": 0} })
	m.HandlerGone("process_exited")
	m.PublishDecision("defer", "filesystem")
	m.PublishFailed("deferred")
	m.StatsFromHost("filesystem")
	m.CollectedGarbage(1)
	m.TargetQuarantined()
	m.SetUnconsumedVolumes(1)
	m.SetQuarantine(1, 2, 1)
	call := func(context.Context, any) (any, error) { return nil, nil }
	if _, err := m.UnaryServerInterceptor()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/crust.v1.VolumeService/GetVolume"}, call); err != nil {
		t.Fatal(err)
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	name := regexp.MustCompile(`\b(?:crust|grpc_server|process|go)_[a-z_]+\b`)
	shown := map[string]bool{}
	for _, file := range []string{"dashboard.json", "prometheusrule.yaml", "rules.test.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", file))
		if err != nil {
			t.Fatal(err)
		}
		if file == "rules.test.yaml" { // its input series; what it expects is the alerts' text
			var series []byte
			for _, line := range bytes.Split(b, []byte("\n")) {
				if bytes.Contains(line, []byte("series:")) {
					series = append(append(series, line...), '\n')
				}
			}
			b = series
		}
		found := 0
		for _, at := range name.FindAllIndex(b, -1) {
			if before := string(b[max(0, at[0]-2):at[0]]); strings.HasSuffix(before, `"`) || strings.HasSuffix(before, "=") || before == ": " {
				continue // a label's value, such as why="process_exited"
			}
			found++
			n := string(b[at[0]:at[1]])
			family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
			if !exported[family] {
				t.Errorf("%s names %s, which crust does not export", file, n)
			}
			shown[family] = shown[family] || file == "dashboard.json"
		}
		if found == 0 {
			t.Errorf("%s names no metric", file)
		}
	}
	for family := range exported {
		if strings.HasPrefix(family, "crust_") && !shown[family] {
			t.Errorf("dashboard.json does not show %s", family)
		}
	}
}

// The secure endpoint serves /metrics alone, over TLS, and only through the guard: without a token it is
// a 401 before any question to the API server (here one that cannot be reached).
func TestSecureEndpoint(t *testing.T) {
	dir := t.TempDir()
	crt, _, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, crt, 0o600); err != nil {
		t.Fatal(err)
	}
	api := &guard.APIServer{URL: "https://127.0.0.1:1", CAFile: ca, TokenFile: filepath.Join(dir, "token")}
	m := New()
	srv, err := m.secureServer(Secure{Addr: "127.0.0.1:0", API: api}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	stop := serve(tls.NewListener(l, srv.TLSConfig), srv, errc)
	defer stop()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a self-signed certificate
	for path, want := range map[string]int{"/metrics": http.StatusUnauthorized, "/healthz": http.StatusNotFound, "/readyz": http.StatusNotFound} {
		resp, err := client.Get("https://" + l.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
		if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || resp.TLS.PeerCertificates[0].Subject.CommonName == "" {
			t.Errorf("GET %s: not served with a certificate", path)
		}
	}
	if resp, err := http.Get("http://" + l.Addr().String() + "/metrics"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the secure endpoint: %d, want 400", resp.StatusCode)
		}
	}

	// A certificate and key that cannot be loaded, or an address with no port, is refused, naming the flag.
	for _, s := range []Secure{{Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "none.crt"), KeyFile: filepath.Join(dir, "none.key"), API: api}, {Addr: "127.0.0.1", API: api}} {
		if _, err := m.secureServer(s, slog.Default()); err == nil || !strings.Contains(err.Error(), "--metrics-") {
			t.Errorf("secureServer(%+v): %v, want an error naming the flag", s, err)
		}
	}
}
