package csiproxy

import (
	"context"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/volume"
)

// With --controller, a class's I/O limits never reach the driver's parameters and come back in the
// volume context as given; a limit crustd would refuse is INVALID_ARGUMENT naming the parameter, and the
// driver is not asked.
func TestControllerIOLimits(t *testing.T) {
	cc, d := startController(t)
	ctrl := csi.NewControllerClient(cc)
	ctx := context.Background()
	create := func(params map[string]string, c *csi.VolumeCapability) (*csi.CreateVolumeResponse, error) {
		return ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc", Parameters: params, VolumeCapabilities: []*csi.VolumeCapability{c}})
	}
	seen := func() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.seen) }
	limits := map[string]string{volume.TotalIOPSKey: "50", volume.WriteBytesPerSecondKey: "1Mi"}
	for _, tc := range []struct {
		name      string
		params    map[string]string
		c         *csi.VolumeCapability
		wantDefer bool
	}{
		{"deferring class", map[string]string{DeferKey: "true", "type": "ssd"}, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), true},
		{"limits alone", map[string]string{"type": "ssd"}, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), false},
		{"raw block", map[string]string{DeferKey: "true", "type": "ssd"}, blockCap(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := maps.Clone(tc.params)
			maps.Copy(params, limits)
			resp, err := create(params, tc.c)
			if err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			got := d.seen[len(d.seen)-1].(*csi.CreateVolumeRequest).GetParameters()
			d.mu.Unlock()
			if len(got) != 1 || got["type"] != "ssd" {
				t.Errorf("the driver saw parameters %v, want only type", got)
			}
			want := maps.Clone(limits)
			if tc.wantDefer {
				want[DeferKey] = "true"
			}
			vc := maps.Clone(resp.GetVolume().GetVolumeContext())
			if vc[DeferKey] == "" {
				delete(vc, DeferKey) // the stub echoes the parameter it saw, none
			}
			if !maps.Equal(vc, want) {
				t.Errorf("volume context %v, want %v", vc, want)
			}
		})
	}
	for _, tc := range []struct{ name, key, value, reason string }{
		{"not a quantity", volume.ReadBytesPerSecondKey, "lots", "is not a quantity"},
		{"negative", volume.WriteIOPSKey, "-3", "is negative"},
		{"too large", volume.TotalBytesPerSecondKey, "2P", "is larger than"},
		{"total and read", volume.ReadIOPSKey, "10", "cannot be set together with " + volume.TotalIOPSKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := seen()
			params := map[string]string{DeferKey: "true", volume.TotalIOPSKey: "50", tc.key: tc.value}
			_, err := create(params, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER))
			if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), tc.key+": ") ||
				!strings.Contains(s.Message(), tc.reason) {
				t.Errorf("got %v, want INVALID_ARGUMENT naming %s: ...%s", err, tc.key, tc.reason)
			}
			if n := seen(); n != before {
				t.Errorf("the driver was asked %d times for a refused request", n-before)
			}
		})
	}
}

// On the node, a deferred publish carries the volume context's I/O limits into the descriptor; limits
// crustd would refuse are INVALID_ARGUMENT naming the parameter at stage and at publish, and nothing is
// staged, published, recorded or deposited.
func TestNodeIOLimits(t *testing.T) {
	e := newEnv(t)
	cc := startProxy(t, e.config(), e.log)
	node := csi.NewNodeClient(cc)
	ctx := context.Background()
	r, err := e.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-limits", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		Parameters:         map[string]string{DeferKey: "true", volume.ReadIOPSKey: "100", volume.TotalBytesPerSecondKey: "10Mi"}})
	if err != nil {
		t.Fatal(err)
	}
	vol := r.GetVolume()
	t.Cleanup(func() {
		_, _ = e.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
	})
	const uid = "0e0e0e0e-0000-4000-8000-0000000000a1"
	staging, target := e.staging("pv-limits"), e.target(uid, "pv-limits")

	bad := podContext(vol, "ns", "vm", uid)
	bad[volume.WriteIOPSKey] = "1.5"
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: bad}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), volume.WriteIOPSKey) {
		t.Fatalf("stage with a bad limit: %v, want INVALID_ARGUMENT naming %s", err, volume.WriteIOPSKey)
	}
	bad[volume.WriteIOPSKey], bad[volume.WriteBytesPerSecondKey] = "0", "1Mi" // beside the total: crustd's rule
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: xfsCap(""), VolumeContext: bad}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), volume.WriteBytesPerSecondKey+": cannot be set together with "+volume.TotalBytesPerSecondKey) {
		t.Fatalf("publish with exclusive limits: %v, want INVALID_ARGUMENT naming %s", err, volume.WriteBytesPerSecondKey)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("a refused publish made the target: %v", err)
	}
	e.assertClean()

	good := podContext(vol, "ns", "vm", uid)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: good}); err != nil {
		t.Fatal(err)
	}
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: xfsCap(""), VolumeContext: good}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	got, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if want := (&crustv1.IOLimits{ReadIops: 100, TotalBytesPerSecond: 10 << 20}); err != nil || !proto.Equal(got.GetVolume().GetSpec().GetIoLimits(), want) {
		t.Fatalf("descriptor %v, %v; want io_limits %v", got, err, want)
	}
	// One builder: the driver's own call to api/client with the same request deposits the same descriptor,
	// so crustd takes it as a repeat (another descriptor would be ALREADY_EXISTS) and keeps what it holds.
	direct, err := client.New(e.crustSock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = direct.Close() }()
	if _, err := direct.Publish(ctx, pub, got.GetVolume().GetSpec().GetVolumeBackingPath(), client.CreateFilesystem(),
		client.DriverName(e.driverName)); err != nil {
		t.Fatalf("the same publish through api/client: %v", err)
	}
	again, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if err != nil || !proto.Equal(again.GetVolume().GetSpec(), got.GetVolume().GetSpec()) {
		t.Fatalf("after the direct publish: %v, %v; want %v", again, err, got)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
