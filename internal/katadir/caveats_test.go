package katadir

import (
	"slices"
	"strings"
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

// TestKataCaveatOfALongPath: a target path Kata cannot name gives a volume the one caveat that Kata does
// not find it, whatever Kata would have made of the rest (pmem, I/O limits); a raw block volume, never
// projected whatever its path, keeps its own caveat.
func TestKataCaveatOfALongPath(t *testing.T) {
	long := "/var/lib/kubelet/pods/0e0e0e0e-0000-4000-8000-000000000001/volumes/kubernetes.io~csi/" +
		strings.Repeat("p", 253) + "/mount"
	pmem := &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: long, VolumeType: crustv1.VolumeType_VOLUME_TYPE_PMEM,
		IoLimits: &crustv1.IOLimits{}}, DeviceNumber: &crustv1.DeviceNumber{Major: 259}}
	if got := Caveats(pmem); !slices.Equal(got, []string{PathTooLongCaveat}) {
		t.Errorf("pmem with I/O limits at a long path: %q, want the path caveat alone", got)
	}
	raw := &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: long, VolumeMode: crustv1.VolumeMode_VOLUME_MODE_BLOCK}}
	if got := Caveats(raw); !slices.Equal(got, []string{RawBlockCaveat}) {
		t.Errorf("raw block at a long path: %q, want the raw block caveat", got)
	}
}
