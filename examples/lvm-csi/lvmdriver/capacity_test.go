package lvmdriver_test

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/examples/lvm-csi/lvmdriver"
)

// With capacity tracking on, the node is the topology of the driver and of its volumes, and GetCapacity
// follows the volume group's free space; another node's segment has none.
func TestCapacity(t *testing.T) {
	d, _ := startOnVG(t, 1<<30, lvmdriver.Config{Capacity: true, NodeID: "node-a"})
	ctx := ctxT(t)
	free := func(node string) int64 {
		t.Helper()
		r, err := d.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{lvmdriver.TopologyKey: node}}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetAvailableCapacity()
	}
	before := free("node-a")
	if before < 900<<20 || free("node-b") != 0 {
		t.Fatalf("free: %d on this node, %d on another", before, free("node-b"))
	}
	info, err := d.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || info.GetAccessibleTopology().GetSegments()[lvmdriver.TopologyKey] != "node-a" {
		t.Fatalf("NodeGetInfo = %v, %v", info, err)
	}
	cv, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-cap", CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4", "")}})
	if err != nil {
		t.Fatal(err)
	}
	if top := cv.GetVolume().GetAccessibleTopology(); len(top) != 1 || top[0].GetSegments()[lvmdriver.TopologyKey] != "node-a" {
		t.Errorf("volume topology %v", top)
	}
	if after := free("node-a"); after != before-256<<20 {
		t.Errorf("free after a 256 MiB volume: %d, want %d", after, before-256<<20)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: cv.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}
