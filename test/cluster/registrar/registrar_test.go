package registrar

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/harness"
)

type identity struct {
	csi.UnimplementedIdentityServer
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "test.crust.dev", VendorVersion: "1"}, nil
}

// The registrar waits for a driver that starts after it, then answers kubelet's GetInfo on
// <dir>/<driver>-reg.sock with the kubelet-side endpoint, reports health, and removes its socket at stop.
func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	driverSock := filepath.Join(dir, "csi.sock")
	regDir := filepath.Join(dir, "plugins_registry")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := l.Addr().String()
	_ = l.Close()
	cfg := Config{CSIAddress: driverSock, KubeletRegistrationPath: "/var/lib/kubelet/plugins/test.crust.dev/csi.sock",
		PluginRegistrationPath: regDir, HTTPEndpoint: httpAddr, Timeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()

	// The driver comes up after the registrar: its lateness is what is under test.
	time.Sleep(50 * time.Millisecond)
	ds := testutil.ServeGRPC(t, driverSock, func(s *grpc.Server) { csi.RegisterIdentityServer(s, identity{}) })

	regSock := filepath.Join(regDir, "test.crust.dev-reg.sock")
	harness.Eventually(t, 10*time.Second, "the registration socket", func() bool {
		_, err := os.Stat(regSock)
		return err == nil
	})
	conn, err := grpc.NewClient("unix://"+regSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	rc := registerapi.NewRegistrationClient(conn)
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != "test.crust.dev" || info.GetEndpoint() != cfg.KubeletRegistrationPath ||
		len(info.GetSupportedVersions()) != 1 || info.GetSupportedVersions()[0] != "1.0.0" {
		t.Fatalf("GetInfo = %v", info)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz with the driver up: %d", resp.StatusCode)
	}
	ds.Stop()
	resp, err = http.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/healthz with the driver gone: %d", resp.StatusCode)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Lstat(regSock); !os.IsNotExist(err) {
		t.Errorf("registration socket left after stop: %v", err)
	}
}

func TestMainFlags(t *testing.T) {
	if got := Main(context.Background(), []string{"--csi-address=/x"}, io.Discard); got != 2 {
		t.Errorf("without --kubelet-registration-path: exit %d, want 2", got)
	}
	if got := Main(context.Background(), []string{"--no-such-flag"}, io.Discard); got != 2 {
		t.Errorf("unknown flag: exit %d, want 2", got)
	}
}
