package kata

import (
	"fmt"
	"testing"

	"crust.dev/crust/api/kata/katatest"
)

// Entries crust did not write are read whatever their block volume type: the types in the recorded
// vectors, and "blk", each read back with its type as written (crust writes "directvol" only).
func TestBlockVolumeTypes(t *testing.T) {
	for _, v := range katatest.Load(t) {
		if vt := katatest.ReadBack[MountInfo](t, v).VolumeType; !IsBlockVolumeType(vt) {
			t.Errorf("vector %s: volume-type %q is not taken for a block volume", v.Dir, vt)
		}
	}
	dir := t.TempDir()
	types := map[string]bool{
		VolumeTypeDirect: true, VolumeTypeBlock: true, VolumeTypeBlk: true,
		"vfiovol": false, "spdkvol": false, "spoolvol": false, "": false, "Block": false, "directvol ": false,
	}
	i := 0
	for vt, block := range types {
		if got := IsBlockVolumeType(vt); got != block {
			t.Errorf("IsBlockVolumeType(%q) = %v, want %v", vt, got, block)
		}
		if !block {
			continue
		}
		i++
		path := fmt.Sprintf("/var/lib/kubelet/pods/p%d/volumes/kubernetes.io~csi/pv/mount", i)
		info := fmt.Sprintf(`{"volume-type":%q,"device":"/dev/vdb","fstype":"ext4","options":["ro"]}`, vt)
		if err := Add(dir, path, info); err != nil {
			t.Fatalf("add a %q entry: %v", vt, err)
		}
		got, err := Get(dir, path)
		if err != nil || got.VolumeType != vt || got.Device != "/dev/vdb" || got.FsType != "ext4" || len(got.Options) != 1 {
			t.Errorf("a %q entry reads back as %+v (%v)", vt, got, err)
		}
	}
	vols, err := List(dir)
	if err != nil || len(vols) != 3 {
		t.Fatalf("List: %d volumes (%v), want the 3 block ones", len(vols), err)
	}
}
