package csiproxy

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// checkParameters reads and checks crust's keys of a volume context or StorageClass parameters as crustd
// and the descriptor will (volume.ParseIOLimits, volume.ParseEncryption), so that a bad value is refused
// with InvalidArgument naming the parameter before the proxy or the driver does anything. Given
// capabilities, it also refuses encryption for a raw block volume, which the pod gets as a device.
func checkParameters(params map[string]string, caps ...*csi.VolumeCapability) error {
	if _, err := volume.ParseIOLimits(params); err != nil {
		return err
	}
	enc, err := volume.ParseEncryption(params)
	if err != nil || enc == nil {
		return err
	}
	for _, c := range caps {
		if c.GetBlock() != nil {
			return errdefs.Field(volume.EncryptionParamKey, "a raw block volume (volumeMode: Block) is not encrypted "+
				"by crust: the pod gets the device itself; use a filesystem volume")
		}
	}
	return nil
}

// checkAccessMode refuses, with InvalidArgument naming field's access mode and what to use instead, a
// filesystem of a deferring class asked with an access mode that lets several nodes write
// (MULTI_NODE_MULTI_WRITER, MULTI_NODE_SINGLE_WRITER): a deferred filesystem is mounted by each pod's own
// kernel, and crustd keeps one writer per device on its own node only, so pods on two nodes would both
// mount it read-write. MULTI_NODE_READER_ONLY is allowed.
func checkAccessMode(field string, c *csi.VolumeCapability) error {
	m := c.GetAccessMode().GetMode()
	if m != csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER && m != csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER {
		return nil
	}
	return errdefs.Field(field+".access_mode.mode", "%s lets pods on several nodes write the volume, but a class with %s: \"true\" "+
		"mounts its filesystem inside each pod's own kernel, and two kernels writing one filesystem corrupt it; "+
		"use ReadWriteOnce or ReadWriteOncePod, ReadOnlyMany to share it read-only, or a StorageClass without %s "+
		"for a filesystem several nodes write (one the driver shares, such as NFS or CephFS)", m, volume.DeferKey, volume.DeferKey)
}
