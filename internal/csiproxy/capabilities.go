package csiproxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/errdefs"
)

// servedCaps are the node capabilities the proxy advertises whatever the driver has: it serves them for
// deferred volumes (through crustd) and host-mounted ones (on the host), and for the driver's own
// volumes where the driver lacks them:
//
//   - GET_VOLUME_STATS: statfs of a mounted target, the size of a raw block one;
//   - EXPAND_VOLUME: a no-op success, which is what kubelet does when a driver has no node expansion;
//   - VOLUME_MOUNT_GROUP: volume_mount_group is kept from the driver, and the proxy gives the published
//     filesystem the group as kubelet does for fsGroup.
//
// A volume's condition is not among them: this CSI version carries it in NodeGetVolumeHealth
// (GET_VOLUME_HEALTH), which the proxy answers for deferred volumes when asked but cannot answer for the
// volumes of a driver without it, and which kubelet does not call.
var servedCaps = []csi.NodeServiceCapability_RPC_Type{
	csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
}

// driverCaps caches the driver's own node capabilities.
type driverCaps struct {
	mu    sync.Mutex
	known map[csi.NodeServiceCapability_RPC_Type]bool // nil until the driver answered once
}

func capsOf(resp *csi.NodeGetCapabilitiesResponse) map[csi.NodeServiceCapability_RPC_Type]bool {
	m := map[csi.NodeServiceCapability_RPC_Type]bool{}
	for _, c := range resp.GetCapabilities() {
		m[c.GetRpc().GetType()] = true
	}
	return m
}

// NodeGetCapabilities returns the driver's node capabilities and servedCaps.
func (p *Proxy) NodeGetCapabilities(ctx context.Context, r *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp, err := p.node.NodeGetCapabilities(outgoing(ctx), r)
	if err != nil {
		return nil, err
	}
	have := capsOf(resp)
	p.caps.mu.Lock()
	p.caps.known = have
	p.caps.mu.Unlock()
	out := proto.Clone(resp).(*csi.NodeGetCapabilitiesResponse)
	for _, c := range servedCaps {
		if !have[c] {
			out.Capabilities = append(out.Capabilities, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
				Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
		}
	}
	return out, nil
}

// driverHas reports whether the driver itself has a node capability, asking it once.
func (p *Proxy) driverHas(ctx context.Context, c csi.NodeServiceCapability_RPC_Type) (bool, error) {
	p.caps.mu.Lock()
	known := p.caps.known
	p.caps.mu.Unlock()
	if known == nil {
		resp, err := p.node.NodeGetCapabilities(outgoing(ctx), &csi.NodeGetCapabilitiesRequest{})
		if err != nil {
			return false, err
		}
		known = capsOf(resp)
		p.caps.mu.Lock()
		p.caps.known = known
		p.caps.mu.Unlock()
	}
	return known[c], nil
}

// withoutMountGroup returns c without volume_mount_group, and gid, the group it names (mountGroup: nil
// for none, gidErr for a malformed one), when c names one and the driver lacks VOLUME_MOUNT_GROUP;
// otherwise c as it is and no group. gidErr is returned only then: a driver that takes the group is
// given it as it is.
func (p *Proxy) withoutMountGroup(ctx context.Context, c *csi.VolumeCapability, gid *int64, gidErr error) (*csi.VolumeCapability, *int64, error) {
	if gid == nil && gidErr == nil {
		return c, nil, nil
	}
	has, err := p.driverHas(ctx, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	if err != nil || has {
		return c, nil, err
	}
	if gidErr != nil {
		return nil, nil, gidErr
	}
	out := proto.CloneOf(c)
	out.GetMount().VolumeMountGroup = ""
	return out, gid, nil
}

// mountGroup returns the group id c's volume_mount_group names, or nil when it names none.
func mountGroup(c *csi.VolumeCapability) (*int64, error) {
	g := c.GetMount().GetVolumeMountGroup()
	if g == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(g, 10, 32)
	if err != nil || n < 0 {
		return nil, errdefs.Field("volume_capability.mount.volume_mount_group", "%q is not a group id", g)
	}
	return &n, nil
}

// ownStats answers NodeGetVolumeStats for a volume of the driver's when the driver lacks
// GET_VOLUME_STATS: statfs of a mounted directory, the size of a raw block device.
func ownStats(path string) (*csi.NodeGetVolumeStatsResponse, error) {
	fi, err := statVolumePath(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeDevice != 0 {
		size, err := deviceSize(path)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	return statfsUsage(path)
}

// statVolumePath stats the volume_path of a request the proxy answers for the driver: NotFound when
// nothing is there, or when the path is not absolute (CSI's paths are; a relative one would be looked up
// from the proxy's working directory, where no volume is).
func statVolumePath(path string) (os.FileInfo, error) {
	if !filepath.IsAbs(path) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume_path %q is not absolute: no volume is there", path)
	}
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume_path %s does not exist", path)
	}
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "volume_path: %v", err)
	}
	return fi, nil
}
