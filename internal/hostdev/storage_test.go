package hostdev

import (
	"testing"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil"
)

// TestStorageShares: on stackTree's devices, with loop3 and loop5 attached to one file and loop4 to
// another, two names of one storage share it (loop devices over one file, a partition and its disk, a
// device-mapper or md device and what lies under it, at any depth, both ways round), and devices that
// merely lie on a common one (two partitions of a disk, two logical volumes of a volume group) do not.
func TestStorageShares(t *testing.T) {
	files := map[string]LoopBacking{
		"loop3": {Device: unix.Mkdev(8, 1), Inode: 100},
		"loop5": {Device: unix.Mkdev(8, 1), Inode: 100},
		"loop4": {Device: unix.Mkdev(8, 1), Inode: 200},
	}
	s := Sysfs{Root: stackTree(t), Loops: func(bd *BlockDevice) (LoopBacking, error) { return files[bd.Name], nil }}
	number := map[string][2]uint32{
		"loop3": {7, 3}, "loop3p1": {259, 0}, "loop3p2": {259, 1}, "dm-0": {253, 0}, "dm-1": {253, 1},
		"md127": {9, 127}, "md127p1": {259, 2}, "loop4": {7, 4}, "dm-2": {253, 2}, "dm-3": {253, 3}, "loop5": {7, 5},
	}
	storage := func(name string) *Storage {
		t.Helper()
		n := number[name]
		st, err := s.Storage(n[0], n[1])
		if err != nil {
			t.Fatalf("Storage(%s): %v", name, err)
		}
		return st
	}
	checkShares(t, storage, []shareCase{
		{"loop3", "loop5", true},      // two loop devices over one file
		{"loop3", "loop4", false},     // over two files
		{"loop3p1", "loop3", true},    // a partition and its disk
		{"loop3p1", "loop5", true},    // a partition and another loop device over its disk's file
		{"loop3p1", "loop3p2", false}, // two partitions of one disk
		{"dm-0", "loop3p1", true},     // a logical volume and its physical volume
		{"dm-0", "loop3", true},       // ... and that one's disk
		{"dm-0", "loop3p2", false},    // ... but not the disk's other partition
		{"dm-1", "dm-0", true},        // dm-crypt on an LV, and the LV
		{"dm-1", "loop3", true},       // ... and what lies under both
		{"md127", "loop3", true},      // an md array and its member
		{"md127", "loop3p2", true},    // the array is built on the whole disk, the partition's range included
		{"md127p1", "loop5", true},    // the array's partition, and another name of the member's file
		{"dm-2", "dm-3", false},       // two logical volumes of one volume group
		{"dm-2", "loop4", true},       // a logical volume and its physical volume
		{"dm-2", "loop3", false},      // on another file
	})
	if got, want := storage("loop3p2").Own, (Extent{Base: "file 8:1:100", Start: 10240 * 512, End: (10240 + 8192) * 512}); got != want {
		t.Errorf("the storage of loop3p2: %+v, want %+v", got, want)
	}
}

// shareCase is two devices, named as checkShares's storage names them, and whether they share storage.
type shareCase struct {
	a, b  string
	share bool
}

// checkShares checks Shares of each case's devices, both ways round, and that devices that share storage
// have a base in common.
func checkShares(t *testing.T, storage func(string) *Storage, cases []shareCase) {
	t.Helper()
	for _, tc := range cases {
		a, b := storage(tc.a), storage(tc.b)
		if got := a.Shares(b); got != tc.share {
			t.Errorf("%s (%v) shares with %s (%v): %v, want %v", tc.a, a, tc.b, b, got, tc.share)
		}
		if got := b.Shares(a); got != tc.share {
			t.Errorf("%s shares with %s: %v, want %v (the relation is symmetric)", tc.b, tc.a, got, tc.share)
		}
		if tc.share && !intersects(a.Bases(), b.Bases()) {
			t.Errorf("%s and %s share storage but no base: %v, %v", tc.a, tc.b, a.Bases(), b.Bases())
		}
	}
}

func intersects(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// TestStorageOnThisHost asks the kernel: two loop devices over one file share storage, and so do a loop
// device and its partition; loop devices over two files do not. A volume backed by a regular file is its
// file, the one a loop device over that file writes to.
func TestStorageOnThisHost(t *testing.T) {
	dev, file := testutil.Loop(t, 8<<20)
	twin := testutil.LoopOver(t, file)
	other, _ := testutil.Loop(t, 8<<20)
	disk, part := testutil.PartitionedLoop(t, 8<<20)

	var s Sysfs
	storage := func(path string) *Storage {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		got, err := s.Storage(unix.Major(st.Rdev), unix.Minor(st.Rdev))
		if err != nil {
			t.Fatalf("Storage(%s): %v", path, err)
		}
		return got
	}
	checkShares(t, storage, []shareCase{{dev, twin, true}, {dev, other, false}, {disk, part, true}, {part, dev, false}})

	var fst unix.Stat_t
	if err := unix.Stat(file, &fst); err != nil {
		t.Fatal(err)
	}
	v := &crustv1.Volume{DeviceNumber: &crustv1.DeviceNumber{Major: unix.Major(fst.Dev), Minor: unix.Minor(fst.Dev), Inode: fst.Ino}}
	fs, err := s.StorageOf(v)
	if err != nil {
		t.Fatal(err)
	}
	if !fs.Shares(storage(dev)) {
		t.Errorf("the file %s (%v) and %s over it (%v) do not share storage", file, fs, dev, storage(dev))
	}
}
