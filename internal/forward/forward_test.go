package forward

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/testutil"
)

type handler struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer
}

func (handler) GetVolumeStats(_ context.Context, r *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	if r.GetSandboxId() != "vm1" {
		return nil, status.Error(codes.NotFound, "no such sandbox")
	}
	return &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{
		Usage: []*crustv1.VolumeUsage{{Total: 10, Used: 4, Available: 6, Unit: crustv1.VolumeUsage_UNIT_BYTES}},
	}, nil
}

func (handler) ExpandVolume(_ context.Context, r *crustv1.RuntimeHandlerServiceExpandVolumeRequest) (*crustv1.RuntimeHandlerServiceExpandVolumeResponse, error) {
	if r.GetRequiredBytes() > 1<<40 {
		return nil, status.Error(codes.OutOfRange, "too large")
	}
	return &crustv1.RuntimeHandlerServiceExpandVolumeResponse{CapacityBytes: r.GetDeviceBytes() - 1}, nil
}

func handlerVolume(endpoint, sandbox string) *crustv1.Volume {
	return &crustv1.Volume{
		Spec:  &crustv1.VolumeSpec{VolumeTargetPath: "/t", VolumeBackingPath: "/dev/x"},
		Claim: &crustv1.Claim{SandboxId: sandbox, HandlerEndpoint: endpoint},
	}
}

// serveHandler serves the test's handler on a unix socket at sock until the test ends.
func serveHandler(t *testing.T, sock string) {
	t.Helper()
	testutil.ServeGRPC(t, sock, func(s *grpc.Server) { crustv1.RegisterRuntimeHandlerServiceServer(s, handler{}) })
}

// TestHandler: the gRPC path keeps working next to the Kata one.
func TestHandler(t *testing.T) {
	root, err := os.MkdirTemp("", "fh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	sock := filepath.Join(root, "h.sock")
	serveHandler(t, sock)

	f := &Forwarder{}
	defer func() { _ = f.Close() }()
	ctx := context.Background()
	ep := "unix://" + sock

	st, err := f.Stats(ctx, handlerVolume(ep, "vm1"))
	want := &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{{Total: 10, Used: 4, Available: 6, Unit: crustv1.VolumeUsage_UNIT_BYTES}}}
	if err != nil || !proto.Equal(st, want) {
		t.Errorf("Stats = %v, %v", st, err)
	}
	if _, err := f.Stats(ctx, handlerVolume(ep, "vm2")); status.Code(err) != codes.NotFound {
		t.Errorf("handler's NotFound: %v", err)
	}
	if c, err := f.Expand(ctx, handlerVolume(ep, "vm1"), 100, 200); err != nil || c != 199 {
		t.Errorf("Expand = %d, %v", c, err)
	}
	if _, err := f.Expand(ctx, handlerVolume(ep, "vm1"), 1<<41, 1<<41); status.Code(err) != codes.OutOfRange {
		t.Errorf("handler's OutOfRange: %v", err)
	}
	if _, err := f.Stats(ctx, handlerVolume("unix://"+filepath.Join(root, "gone.sock"), "vm1")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("unreachable handler: %v", err)
	}
	if _, err := f.Stats(ctx, handlerVolume("", "vm1")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("no endpoint: %v", err)
	}
}

// TestRestartedHandlerAnswersAtOnce: while the handler is down, calls are Unavailable; once a new handler
// listens on the same endpoint, the very next call reaches it (no reconnect backoff to wait out).
func TestRestartedHandlerAnswersAtOnce(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "h.sock")
	ep := "unix://" + sock
	f := &Forwarder{}
	defer func() { _ = f.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 3 {
		if _, err := f.Stats(ctx, handlerVolume(ep, "vm1")); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("handler down: %v, want Unavailable", err)
		}
	}
	serveHandler(t, sock)
	if _, err := f.Stats(ctx, handlerVolume(ep, "vm1")); err != nil {
		t.Fatalf("first call after the handler came back: %v", err)
	}
}
