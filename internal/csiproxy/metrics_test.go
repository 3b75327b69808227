package csiproxy

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/internal/testutil/harness"
)

// --http-addr serves /healthz, /readyz and /metrics, where every call through the proxy is counted by
// method and code, forwarded raw ones included.
func TestMetricsEndpoint(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cfg := Config{CSIAddress: filepath.Join(dir, "csi.sock"), DriverAddress: serveStub(t, dir, &stubDriver{}),
		CrustSocket: filepath.Join(dir, "no-crustd.sock"), StateDir: filepath.Join(dir, "state"), HTTPAddr: addr}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, quietLog(), Deps{}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	cc, err := crustd.Dial(cfg.CSIAddress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	harness.Eventually(t, 10*time.Second, "the proxy's /readyz", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err == nil
	})
	for i := 0; i < 3; i++ {
		if _, err := csi.NewIdentityClient(cc).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = csi.NewControllerClient(cc).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	get := func(path string) (int, string) {
		t.Helper()
		return harness.HTTPGet(t, addr, path)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := get(p); code != http.StatusOK {
			t.Errorf("%s: %d %s", p, code, body)
		}
	}
	_, body := get("/metrics")
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="OK",grpc_method="GetPluginInfo",grpc_service="csi.v1.Identity",grpc_type="unary"} 3`,
		`grpc_server_handled_total{grpc_code="Unimplemented",grpc_method="ControllerGetCapabilities",grpc_service="csi.v1.Controller",grpc_type="bidi_stream"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
