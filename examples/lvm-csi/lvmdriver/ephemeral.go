package lvmdriver

import (
	"context"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/resource"

	"crust.dev/crust/api/errdefs"
)

// CSI inline ephemeral volumes (the Ephemeral lifecycle mode): kubelet calls only NodePublishVolume and
// NodeUnpublishVolume, with its own volume id and the pod's volume attributes as the volume context. The
// driver makes the logical volume at the first publish (named VolumeID(kubelet's id), tagged
// ephemeralTag besides volumeTag, of the attribute "size" or DefaultCapacity), publishes it without a
// staging path, and removes it at unpublish.

const (
	// ephemeralKey is the volume context key kubelet sets for an inline ephemeral volume.
	ephemeralKey = "csi.storage.k8s.io/ephemeral"
	// ephemeralTag marks a logical volume that lives as long as one inline ephemeral publish.
	ephemeralTag = "crust-csi-ephemeral"
	// ephemeralSizeKey is the volume attribute that sets an inline volume's size (a Kubernetes quantity).
	ephemeralSizeKey = "size"
)

// isEphemeral reports whether a publish is of an inline ephemeral volume.
func isEphemeral(volCtx map[string]string) bool {
	v, _ := strconv.ParseBool(volCtx[ephemeralKey])
	return v
}

// createEphemeral makes (or finds) the logical volume of an inline ephemeral volume and returns its id.
func (d *Driver) createEphemeral(ctx context.Context, req *csi.NodePublishVolumeRequest) (string, error) {
	var size int64
	if s := req.GetVolumeContext()[ephemeralSizeKey]; s != "" {
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() <= 0 {
			return "", errdefs.Errorf(errdefs.ErrInvalidArgument, "volume_context[%q]: %q is not a positive quantity", ephemeralSizeKey, s)
		}
		size = q.Value()
	}
	resp, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               req.GetVolumeId(),
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{req.GetVolumeCapability()},
	})
	if err != nil {
		return "", err
	}
	id := resp.GetVolume().GetVolumeId()
	if _, err := d.lvm.Run(ctx, "lvchange", "--addtag", ephemeralTag, "--", d.cfg.VG+"/"+id); err != nil {
		return "", errdefs.Errorf(errdefs.ErrInternal, "tag %s as ephemeral: %v", id, err)
	}
	return id, nil
}

// removeEphemeral deletes the logical volume behind kubelet's id when it is an inline ephemeral one;
// any other volume, or none, is left alone.
func (d *Driver) removeEphemeral(ctx context.Context, kubeletID string) error {
	lv, err := d.lvm.LV(ctx, d.cfg.VG, VolumeID(kubeletID))
	if err != nil || !lv.HasTag(ephemeralTag) {
		return nil
	}
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: lv.Name})
	return err
}
