package csiproxy

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/testutil"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/unixsocket"
)

// stubDriver answers the proxy's pass-through calls with scripted replies and records what it saw. It is
// a test double for the wire, not a driver: it does nothing on the node.
type stubDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	csi.UnimplementedControllerServer

	mu   sync.Mutex
	seen []proto.Message
	md   []metadata.MD
	err  error
}

func (s *stubDriver) note(ctx context.Context, m proto.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = append(s.seen, proto.Clone(m))
	md, _ := metadata.FromIncomingContext(ctx)
	s.md = append(s.md, md)
	return s.err
}

func (s *stubDriver) GetPluginInfo(ctx context.Context, r *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.GetPluginInfoResponse{Name: "stub.crust.dev", VendorVersion: "1"}, nil
}

func (s *stubDriver) NodeGetCapabilities(ctx context.Context, r *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{
		{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}}},
		{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_GET_VOLUME_STATS}}},
	}}, nil
}

func (s *stubDriver) NodeStageVolume(ctx context.Context, r *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (s *stubDriver) NodePublishVolume(ctx context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (s *stubDriver) NodeGetVolumeStats(ctx context.Context, r *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: 42}}}, nil
}

func (s *stubDriver) CreateVolume(ctx context.Context, r *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "v-" + r.GetName(), CapacityBytes: 7,
		VolumeContext: map[string]string{DeferKey: r.GetParameters()[DeferKey]}}}, nil
}

func (s *stubDriver) DeleteVolume(ctx context.Context, r *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := s.note(ctx, r); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// serveStub serves d on a socket in dir, with opts, and returns the socket.
func serveStub(t *testing.T, dir string, d *stubDriver, opts ...grpc.ServerOption) string {
	t.Helper()
	sock := filepath.Join(dir, "driver.sock")
	l := testutil.Listen(t, sock)
	s := grpc.NewServer(opts...)
	csi.RegisterIdentityServer(s, d)
	csi.RegisterNodeServer(s, d)
	csi.RegisterControllerServer(s, d)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return sock
}

// startProxy runs a proxy in this process in front of driverSock and returns a connection to it.
func startProxy(t testing.TB, cfg Config, log *slog.Logger) *grpc.ClientConn {
	t.Helper()
	_, cc := runProxy(t, cfg, log, Deps{})
	return cc
}

// runProxy is startProxy with deps that returns the proxy too.
func runProxy(t testing.TB, cfg Config, log *slog.Logger, deps Deps) (*Proxy, *grpc.ClientConn) {
	t.Helper()
	p, cc, _ := runStoppableProxy(t, cfg, log, deps)
	return p, cc
}

// runStoppableProxy is runProxy that returns what stops the proxy (as a restart would) before the test
// ends too.
func runStoppableProxy(t testing.TB, cfg Config, log *slog.Logger, deps Deps) (*Proxy, *grpc.ClientConn, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := New(ctx, cfg, log, deps)
	if err != nil {
		t.Fatal(err)
	}
	l, err := unixsocket.Listen(cfg.CSIAddress)
	if err != nil {
		t.Fatal(err)
	}
	s := p.NewServer()
	go func() { _ = s.Serve(l) }()
	cc, err := crustd.Dial(cfg.CSIAddress)
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(func() { _ = cc.Close(); s.Stop(); p.Close(); cancel() })
	t.Cleanup(stop)
	return p, cc, stop
}

// TestPassThrough: responses, errors (code, message, details), metadata and unknown services reach the
// other side as they were, and secrets never reach the log.
func TestPassThrough(t *testing.T) {
	dir := t.TempDir()
	d := &stubDriver{}
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cc := startProxy(t, Config{CSIAddress: filepath.Join(dir, "csi.sock"), DriverAddress: serveStub(t, dir, d),
		CrustSocket: filepath.Join(dir, "no-crustd.sock"), StateDir: filepath.Join(dir, "state")}, log)
	node, ident, ctrl := csi.NewNodeClient(cc), csi.NewIdentityClient(cc), csi.NewControllerClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-trace", "abc")

	info, err := ident.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "stub.crust.dev" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	// The driver's capabilities, then those the proxy serves for every volume that the driver lacks.
	caps, err := node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	var got []csi.NodeServiceCapability_RPC_Type
	for _, c := range caps.GetCapabilities() {
		got = append(got, c.GetRpc().GetType())
	}
	if want := []csi.NodeServiceCapability_RPC_Type{csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS, csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("NodeGetCapabilities = %v, %v; want %v", got, err, want)
	}

	// A publish without deferral reaches the driver unchanged, secrets included; the log has none.
	pub := &csi.NodePublishVolumeRequest{VolumeId: "v1", TargetPath: filepath.Join(dir, "t"), VolumeCapability: mountCap(),
		Secrets: map[string]string{"password": "hunter2"}, VolumeContext: map[string]string{"k": "v"}}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	last, md := d.seen[len(d.seen)-1], d.md[len(d.md)-1]
	d.mu.Unlock()
	if !proto.Equal(last, pub) {
		t.Fatalf("driver saw %v, want %v", last, pub)
	}
	if got := md.Get("x-trace"); len(got) != 1 || got[0] != "abc" {
		t.Fatalf("metadata not forwarded: %v", md)
	}

	// Errors come back with their code, message and details.
	det, _ := status.New(codes.FailedPrecondition, "volume busy").WithDetails(&errdetails.ErrorInfo{Reason: "BUSY"})
	d.mu.Lock()
	d.err = det.Err()
	d.mu.Unlock()
	_, err = node.NodePublishVolume(ctx, pub)
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "volume busy" || len(st.Details()) != 1 {
		t.Fatalf("error came back as %v (details %v)", st, st.Details())
	}
	_, err = ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "x"})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "volume busy" {
		t.Fatalf("raw-forwarded error came back as %v", st)
	}
	d.mu.Lock()
	d.err = nil
	d.mu.Unlock()

	// A service the proxy does not serve itself (Controller) is forwarded raw, secrets and all.
	cv, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", Secrets: map[string]string{"token": "s3cr3t"},
		Parameters: map[string]string{DeferKey: "true"}})
	if err != nil || cv.GetVolume().GetVolumeId() != "v-pvc-1" || cv.GetVolume().GetVolumeContext()[DeferKey] != "true" {
		t.Fatalf("CreateVolume through the proxy = %v, %v", cv, err)
	}
	d.mu.Lock()
	if got := d.seen[len(d.seen)-1].(*csi.CreateVolumeRequest); got.GetSecrets()["token"] != "s3cr3t" {
		t.Fatalf("driver saw %v", got)
	}
	d.mu.Unlock()
	// A method unknown to both sides keeps the driver's UNIMPLEMENTED.
	if _, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListSnapshots: %v, want UNIMPLEMENTED from the driver", err)
	}

	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	for _, secret := range []string{"hunter2", "s3cr3t"} {
		if strings.Contains(out, secret) {
			t.Fatalf("a secret reached the log:\n%s", out)
		}
	}
	if !strings.Contains(out, volume.Redacted) || !strings.Contains(out, "/csi.v1.Controller/CreateVolume") {
		t.Fatalf("the log lacks the stripped request or the forwarded call:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
