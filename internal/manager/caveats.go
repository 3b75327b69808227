package manager

import (
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// Caveats crustd reports in Volume.kata_caveats, one sentence each.
const (
	// CaveatRawBlock: a raw block descriptor has no Kata projection (see kata.Projects).
	CaveatRawBlock = "raw block (volume_mode VOLUME_MODE_BLOCK) is not projected into the Kata direct-volume " +
		"directory: Kata mounts every direct-assigned volume as a filesystem, so an unmodified Kata runtime " +
		"gets this device only as the raw block device kubelet maps into the pod, not from crust"
)

// kataCaveats says what an unmodified Kata runtime cannot honour of v's descriptor (none: nil).
func kataCaveats(v *crustv1.Volume) []string {
	var c []string
	if v.GetSpec().GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
		c = append(c, CaveatRawBlock)
	}
	return c
}

// answer returns v as crustd answers it: with its Kata caveats, computed now (a copy when there are
// any; v itself, which may be the stored volume, is never changed).
func (m *Manager) answer(v *crustv1.Volume) *crustv1.Volume {
	c := kataCaveats(v)
	if len(c) == 0 || v == nil {
		return v
	}
	a := proto.CloneOf(v)
	a.KataCaveats = c
	return a
}
