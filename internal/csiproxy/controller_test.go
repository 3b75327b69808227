package csiproxy

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func mountCapMode(fs string, m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: m}}
}

// startController starts a proxy with --controller in front of a stub driver, and returns a connection to
// the proxy and the driver.
func startController(t *testing.T) (*grpc.ClientConn, *stubDriver) {
	t.Helper()
	dir := t.TempDir()
	d := &stubDriver{}
	cc := startProxy(t, Config{Controller: true, CSIAddress: filepath.Join(dir, "csi.sock"), DriverAddress: serveStub(t, dir, d)}, quietLog())
	return cc, d
}

// With --controller, CreateVolume of a deferring class for a filesystem is asked of the driver as block,
// crust's parameter never reaches the driver, and the answer's volume context says crust.dev/defer; raw
// block and other classes keep their capabilities; every other call reaches the driver as it came.
func TestControllerCreateVolume(t *testing.T) {
	cc, d := startController(t)
	ctrl := csi.NewControllerClient(cc)
	ctx := context.Background()
	rwo, rwop := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	for _, tc := range []struct {
		name       string
		params     map[string]string
		caps       []*csi.VolumeCapability
		wantCaps   []*csi.VolumeCapability // what the driver sees
		wantDefer  bool                    // crust.dev/defer: "true" in the answer's context
		wantParams map[string]string       // what the driver sees
	}{
		{"no key", map[string]string{"type": "ssd"}, []*csi.VolumeCapability{mountCapMode("xfs", rwo)},
			[]*csi.VolumeCapability{mountCapMode("xfs", rwo)}, false, map[string]string{"type": "ssd"}},
		{"filesystem, deferring", map[string]string{DeferKey: "true", "type": "ssd"},
			[]*csi.VolumeCapability{mountCapMode("ext4", rwo), mountCapMode("xfs", rwo), mountCapMode("", rwop)},
			[]*csi.VolumeCapability{blockCapability(mountCapMode("", rwo)), blockCapability(mountCapMode("", rwop))}, true,
			map[string]string{"type": "ssd"}},
		{"raw block, deferring class", map[string]string{DeferKey: "true"}, []*csi.VolumeCapability{blockCap()},
			[]*csi.VolumeCapability{blockCap()}, false, map[string]string{}},
		{"filesystem, defer off", map[string]string{DeferKey: "false"}, []*csi.VolumeCapability{mountCapMode("ext4", rwo)},
			[]*csi.VolumeCapability{mountCapMode("ext4", rwo)}, false, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &csi.CreateVolumeRequest{Name: "pvc-" + tc.name, Parameters: tc.params, VolumeCapabilities: tc.caps,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, Secrets: map[string]string{"k": "s"}}
			resp, err := ctrl.CreateVolume(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			seen := d.seen[len(d.seen)-1].(*csi.CreateVolumeRequest)
			d.mu.Unlock()
			want := proto.Clone(req).(*csi.CreateVolumeRequest)
			want.VolumeCapabilities, want.Parameters = tc.wantCaps, tc.wantParams
			if len(want.Parameters) == 0 {
				want.Parameters = nil
			}
			if len(seen.Parameters) == 0 {
				seen.Parameters = nil
			}
			if !proto.Equal(seen, want) {
				t.Errorf("the driver saw\n%v\nwant\n%v", seen, want)
			}
			if got := resp.GetVolume().GetVolumeContext()[DeferKey] == "true"; got != tc.wantDefer {
				t.Errorf("answer's context %v: deferred %v, want %v", resp.GetVolume().GetVolumeContext(), got, tc.wantDefer)
			}
			if resp.GetVolume().GetVolumeId() != "v-"+req.GetName() || resp.GetVolume().GetCapacityBytes() != 7 {
				t.Errorf("answer changed: %v", resp)
			}
		})
	}

	// Other controller calls and any other service pass through as they came.
	del := &csi.DeleteVolumeRequest{VolumeId: "v1", Secrets: map[string]string{"k": "s"}}
	if _, err := ctrl.DeleteVolume(ctx, del); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	last := d.seen[len(d.seen)-1]
	d.mu.Unlock()
	if !proto.Equal(last, del) {
		t.Errorf("DeleteVolume reached the driver as %v", last)
	}
	if info, err := csi.NewIdentityClient(cc).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil || info.GetName() != "stub.crust.dev" {
		t.Errorf("GetPluginInfo = %v, %v", info, err)
	}
}
