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
