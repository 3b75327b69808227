package kata

import (
	"slices"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestKataCaveatOfAFile: a file-backed pmem volume (its device number carries an inode) has the caveat that
// Kata does not attach it at all; a file-backed volume of type FILE has none of pmem's.
func TestKataCaveatOfAFile(t *testing.T) {
	file := &crustv1.DeviceNumber{Major: 8, Minor: 1, Inode: 42}
	for _, tc := range []struct {
		typ  crustv1.VolumeType
		dn   *crustv1.DeviceNumber
		want []string
	}{
		{crustv1.VolumeType_VOLUME_TYPE_PMEM, file, []string{PmemFileCaveat}},
		{crustv1.VolumeType_VOLUME_TYPE_PMEM, &crustv1.DeviceNumber{Major: 259, Minor: 0}, []string{PmemCaveat}},
		{crustv1.VolumeType_VOLUME_TYPE_FILE, file, nil},
		{crustv1.VolumeType_VOLUME_TYPE_BLOCK, &crustv1.DeviceNumber{Major: 7, Minor: 0}, nil},
	} {
		v := &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeType: tc.typ}, DeviceNumber: tc.dn}
		if got := Caveats(v); !slices.Equal(got, tc.want) {
			t.Errorf("%v on %v: %q, want %q", tc.typ, tc.dn, got, tc.want)
		}
	}
}
