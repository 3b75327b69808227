package hostdev

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev/sysfstree"
	"crust.dev/crust/internal/testutil"
)

// stackTree lays out, as the kernel would, devices built on loop3 that this host cannot make (no
// device-mapper, no md, no partition tables here): two partitions, LVM on the first, dm-crypt on that LV,
// and an md array with a partition of its own on the disk; and beside it loop4 with an LV of its own.
func stackTree(t *testing.T) string {
	root := t.TempDir()
	const vb = "virtual/block/"
	for _, d := range []sysfstree.Device{
		{Dir: vb + "loop3", Major: 7, Minor: 3, Name: "loop3", Holders: []string{vb + "md127"}},
		{Dir: vb + "loop3/loop3p1", Major: 259, Minor: 0, Name: "loop3p1", Files: partition(1, 2048, 8192),
			Holders: []string{vb + "dm-0"}},
		{Dir: vb + "loop3/loop3p2", Major: 259, Minor: 1, Name: "loop3p2", Files: partition(2, 10240, 8192)},
		{Dir: vb + "dm-0", Major: 253, Minor: 0, Name: "dm-0", Files: map[string]string{"dm/name": "vg0-lv0\n"},
			Holders: []string{vb + "dm-1"}},
		{Dir: vb + "dm-1", Major: 253, Minor: 1, Name: "dm-1", Files: map[string]string{"dm/name": "secret\n"}},
		{Dir: vb + "md127", Major: 9, Minor: 127, Name: "md127", Files: map[string]string{"md/level": "raid1\n"}},
		{Dir: vb + "md127/md127p1", Major: 259, Minor: 2, Name: "md127p1", Files: partition(1, 2048, 4096)},
		{Dir: vb + "loop4", Major: 7, Minor: 4, Name: "loop4", Holders: []string{vb + "dm-2", vb + "dm-3"}},
		{Dir: vb + "dm-2", Major: 253, Minor: 2, Name: "dm-2", Files: map[string]string{"dm/name": "vg1-lv0\n"}},
		{Dir: vb + "dm-3", Major: 253, Minor: 3, Name: "dm-3", Files: map[string]string{"dm/name": "vg1-lv1\n"}},
		{Dir: vb + "loop5", Major: 7, Minor: 5, Name: "loop5"},
	} {
		mustDo(t, sysfstree.Add(root, d))
	}
	return root
}

// partition is the files of partition number n, start and size in 512-byte sectors.
func partition(n, start, size int) map[string]string {
	return map[string]string{"partition": fmt.Sprintf("%d\n", n), "start": fmt.Sprintf("%d\n", start), "size": fmt.Sprintf("%d\n", size)}
}

func names(bds []*BlockDevice) []string {
	out := make([]string, len(bds))
	for i, bd := range bds {
		out[i] = bd.Name
	}
	return out
}

// TestStack finds every device built on a device, through partitions and holders at any depth, and
// nothing built on another device.
func TestStack(t *testing.T) {
	s := Sysfs{Root: stackTree(t)}
	for _, tc := range []struct {
		major, minor uint32
		want         []string
	}{
		{7, 3, []string{"loop3", "dm-0", "dm-1", "loop3p1", "loop3p2", "md127", "md127p1"}},
		{259, 0, []string{"loop3p1", "dm-0", "dm-1"}},
		{253, 1, []string{"dm-1"}},
		{7, 4, []string{"loop4", "dm-2", "dm-3"}},
		{7, 5, []string{"loop5"}},
	} {
		stack, err := s.Stack(tc.major, tc.minor)
		if err != nil {
			t.Fatalf("%d:%d: %v", tc.major, tc.minor, err)
		}
		got := names(stack)
		if got[0] != tc.want[0] || !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(tc.want))) {
			t.Errorf("Stack(%d:%d) = %v; want %v, the device first", tc.major, tc.minor, got, tc.want)
		}
	}
	if _, err := s.Stack(7, 99); !errors.Is(err, ErrNoBlockDevice) {
		t.Errorf("Stack of a device the kernel does not have: %v; want ErrNoBlockDevice", err)
	}
}

// The mount table below mounts, of loop3's stack: dm-crypt's device by number, a partition by number, and
// the md array's partition as btrfs does (an anonymous number, the device in the source); a raw block
// publish of loop3 (a bind mount of its device node, whose number is devtmpfs's) mounts no filesystem of
// it. loop4's LV is mounted by number.
const stackMountInfo = `22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
36 22 253:1 / /mnt/crypt rw,relatime shared:20 - ext4 /dev/mapper/secret rw
37 22 259:1 / /var/lib/kubelet/plugins/kubernetes.io/csi/d/globalmount rw - xfs /dev/loop3p2 rw
38 22 0:55 / /mnt/btrfs rw - btrfs /dev/md127p1 rw,space_cache=v2
39 22 0:5 /loop3 /var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv/pod rw - devtmpfs udev rw
40 22 253:2 / /mnt/other rw - ext4 /dev/mapper/vg1-lv0 rw
`

// TestMounts finds the mounts of a device and of the devices built on it, and no other.
func TestMounts(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	mustDo(t, os.WriteFile(mi, []byte(stackMountInfo), 0o644))
	c := MountCheck{Sysfs: Sysfs{Root: stackTree(t)}, MountInfo: mi}

	for _, tc := range []struct {
		major, minor uint32
		want         []string // device at point
	}{
		{7, 3, []string{"dm-1 /mnt/crypt", "loop3p2 /var/lib/kubelet/plugins/kubernetes.io/csi/d/globalmount", "md127p1 /mnt/btrfs"}},
		{259, 0, []string{"dm-1 /mnt/crypt"}},
		// The array is built on the whole of loop3, so it shares storage with loop3p2, which is mounted.
		{9, 127, []string{"md127p1 /mnt/btrfs", "loop3p2 /var/lib/kubelet/plugins/kubernetes.io/csi/d/globalmount"}},
		{253, 0, []string{"dm-1 /mnt/crypt"}},
		{7, 4, []string{"dm-2 /mnt/other"}},
		{7, 5, nil},
	} {
		mounts, err := c.Mounts(tc.major, tc.minor)
		if err != nil {
			t.Fatalf("%d:%d: %v", tc.major, tc.minor, err)
		}
		var got []string
		for _, m := range mounts {
			got = append(got, m.Device.Name+" "+m.Point)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Mounts(%d:%d) = %q; want %q", tc.major, tc.minor, got, tc.want)
		}
	}

	vol := func(major, minor uint32) *crustv1.Volume {
		return &crustv1.Volume{ResolvedBackingPath: "/dev/x", DeviceNumber: &crustv1.DeviceNumber{Major: major, Minor: minor}}
	}
	err := c.NotMounted(vol(7, 3))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("NotMounted of loop3: %v; want ErrFailedPrecondition", err)
	}
	for _, want := range []string{"/dev/dm-1 at /mnt/crypt", "/dev/loop3p2 at /var/lib/kubelet/", "/dev/md127p1 at /mnt/btrfs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NotMounted of loop3: %q does not name %q", err, want)
		}
	}
	if err := c.NotMounted(vol(7, 5)); err != nil {
		t.Errorf("NotMounted of loop5, mounted nowhere: %v", err)
	}
	file := &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeType: crustv1.VolumeType_VOLUME_TYPE_FILE},
		DeviceNumber: &crustv1.DeviceNumber{Major: 7, Minor: 3, Inode: 12}}
	if err := c.NotMounted(file); err != nil {
		t.Errorf("NotMounted of an image file: %v; want nil (not checked)", err)
	}
	if err := c.NotMounted(vol(7, 99)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("NotMounted of a device the kernel does not have: %v; want ErrFailedPrecondition", err)
	}
	c.MountInfo = filepath.Join(t.TempDir(), "absent")
	if err := c.NotMounted(vol(7, 5)); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("NotMounted without a mount table: %v; want ErrInternal", err)
	}
}

// TestMountsOnThisHost mounts real loop devices: a partition of a partitioned loop device and a whole
// one, each found through its disk, through another loop device over its file, and through its
// partition, and reported gone once unmounted.
func TestMountsOnThisHost(t *testing.T) {
	disk, part := testutil.PartitionedLoop(t, 8<<20)
	whole, wholeFile := testutil.Loop(t, 8<<20)
	number := func(p string) (uint32, uint32) {
		var st unix.Stat_t
		mustDo(t, unix.Stat(p, &st))
		return unix.Major(st.Rdev), unix.Minor(st.Rdev)
	}
	stack, err := Sysfs{}.Stack(number(disk))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(stack), []string{filepath.Base(disk), filepath.Base(part)}; !slices.Equal(got, want) {
		t.Fatalf("Stack(%s) = %v; want %v", disk, got, want)
	}
	// A loop device over whole's file, and the partition of a disk mounted whole: other names of a
	// mounted device.
	twin := testutil.LoopOver(t, wholeFile)
	for _, dev := range []struct{ disk, mounted string }{{disk, part}, {whole, whole}, {twin, whole}, {part, disk}} {
		if out, err := exec.Command("mkfs.ext4", "-q", dev.mounted).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext4 %s: %v: %s", dev.mounted, err, out)
		}
		point := t.TempDir()
		mustDo(t, unix.Mount(dev.mounted, point, "ext4", 0, ""))
		mounts, err := MountCheck{}.Mounts(number(dev.disk))
		_ = unix.Unmount(point, 0)
		if err != nil || len(mounts) != 1 || mounts[0].Point != point || mounts[0].Device.Name != filepath.Base(dev.mounted) {
			t.Errorf("Mounts(%s) with %s mounted at %s: %+v, %v", dev.disk, dev.mounted, point, mounts, err)
		}
		if mounts, err := (MountCheck{}).Mounts(number(dev.disk)); err != nil || len(mounts) != 0 {
			t.Errorf("Mounts(%s) after the unmount: %+v, %v; want none", dev.disk, mounts, err)
		}
	}
}
