package csiproxy

import (
	"context"
	"maps"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/volume"
)

// publishRequest is a NodePublishVolume request as the proxy reads it: made once, by newPublishRequest,
// at the top of NodePublishVolume and passed down, so that each fact of the request is worked out once.
// It is not modified once made.
type publishRequest struct {
	// sent is the request as kubelet sent it: what the driver is given, forwarded or published as raw
	// block.
	sent *csi.NodePublishVolumeRequest
	// req is sent with the enriched volume context (Proxy.volumeContext: the StorageClass's crust keys
	// added) and, for an encrypted volume whose secrets lack its key, the key its stage was given
	// (stageKeys); sent itself when that adds nothing: what crust's keys are read from and what
	// api/client builds a deferred volume's descriptor from.
	req *csi.NodePublishVolumeRequest
	// deferAsked is whether req's volume context asks for deferral (DeferRequested).
	deferAsked bool
	// block and mount are whether the capability is a block or a mount one (neither without a capability).
	block, mount bool
	// readOnly is whether the publish is read-only (client.ReadOnly: the readonly flag, or a reader-only
	// access mode).
	readOnly bool
	// fsType is the mount capability's filesystem type, volume.DefaultFSType when it names none.
	fsType string
	// mountFlags are the mount capability's flags, as given.
	mountFlags []string
	// gid is the group the capability's volume_mount_group names, nil for none (mountGroup); gidErr is
	// its InvalidArgument when that is not a group id, returned only where the group is needed.
	gid    *int64
	gidErr error
	// pod is the pod the volume context names (client.PodInfo), for its Events and its fsGroup policy.
	pod client.Pod
}

// newPublishRequest reads r once: its volume context enriched by the StorageClass's crust keys
// (volumeContext) and every fact of it the publish path uses. r is not modified.
func (p *Proxy) newPublishRequest(ctx context.Context, r *csi.NodePublishVolumeRequest) *publishRequest {
	volCtx := p.volumeContext(ctx, r.GetVolumeContext(), r.GetVolumeId())
	c := r.GetVolumeCapability()
	pr := &publishRequest{
		sent:       r,
		req:        r,
		deferAsked: DeferRequested(volCtx),
		block:      c.GetBlock() != nil,
		mount:      isMount(c),
		readOnly:   client.ReadOnly(r),
		fsType:     c.GetMount().GetFsType(),
		mountFlags: c.GetMount().GetMountFlags(),
		pod:        client.PodInfo(volCtx),
	}
	if pr.fsType == "" {
		pr.fsType = volume.DefaultFSType
	}
	pr.gid, pr.gidErr = mountGroup(c)
	if !maps.Equal(r.GetVolumeContext(), volCtx) {
		pr.req = proto.CloneOf(r)
		pr.req.VolumeContext = volCtx
	}
	if _, given := r.GetSecrets()[volume.EncryptionSecretKey]; !given {
		if key, ok := p.stageKeys.get(r.GetStagingTargetPath()); ok {
			if pr.req == r {
				pr.req = proto.CloneOf(r)
			}
			pr.req.Secrets = maps.Clone(r.GetSecrets())
			if pr.req.Secrets == nil {
				pr.req.Secrets = map[string]string{}
			}
			pr.req.Secrets[volume.EncryptionSecretKey] = key
		}
	}
	return pr
}

// volumeContext is the enriched volume context: req's.
func (pr *publishRequest) volumeContext() map[string]string { return pr.req.GetVolumeContext() }
