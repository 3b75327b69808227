package lvmdriver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"crust.dev/crust/api/errdefs"
)

// TopologyKey is the topology key of the node a volume group is on, with Config.Capacity.
const TopologyKey = "topology.lvm.test.crust.dev/node"

// With Config.Capacity the driver reports, as local-volume drivers do for storage capacity tracking:
// the node it runs on as topology (NodeGetInfo, and each created volume's accessible topology), and the
// volume group's free bytes through GetCapacity (zero for another node's segment).

func (d *Driver) topology() []*csi.Topology {
	if !d.cfg.Capacity {
		return nil
	}
	return []*csi.Topology{{Segments: map[string]string{TopologyKey: d.cfg.NodeID}}}
}

// GetCapacity returns the volume group's free bytes, or zero for a segment that is not this node's.
// The largest volume it could create is that much (one volume may take all the free extents).
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if !d.cfg.Capacity {
		return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "GetCapacity: the driver runs without --capacity")
	}
	for _, c := range req.GetVolumeCapabilities() {
		if err := checkCapability("volume_capabilities", c); err != nil {
			return nil, err
		}
	}
	if n, ok := req.GetAccessibleTopology().GetSegments()[TopologyKey]; ok && n != d.cfg.NodeID {
		return &csi.GetCapacityResponse{AvailableCapacity: 0}, nil
	}
	vg, err := d.lvm.VG(ctx, d.cfg.VG)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "volume group: %v", err)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: vg.Free, MaximumVolumeSize: wrapperspb.Int64(vg.Free)}, nil
}
