package hostdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/hostdev/sysfstree"
	"crust.dev/crust/internal/testutil"
)

// TestBlockOnThisHost asks the real sysfs about real devices: an attached loop device, the host's other
// disks where there are some, and a number no device has. (This kernel finds no partitions on loop
// devices, so partitions are covered by TestBlockKinds.)
func TestBlockOnThisHost(t *testing.T) {
	dev, _ := testutil.Loop(t, 1<<20)
	name := strings.TrimPrefix(dev, "/dev/")

	number := func(p string) (uint32, uint32) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return unix.Major(st.Rdev), unix.Minor(st.Rdev)
	}
	check := func(label, path, wantName string, wantKind Kind) {
		t.Helper()
		maj, mnr := number(path)
		bd, err := Sysfs{}.Block(maj, mnr)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if bd.Name != wantName || bd.Kind != wantKind || !slices.Equal(bd.Names, []string{wantName}) {
			t.Errorf("%s %d:%d: %+v; want name %s, kind %s", label, maj, mnr, bd, wantName, wantKind)
		}
	}
	check("attached loop device", dev, name, KindLoop)
	if _, err := os.Stat("/sys/block/vda/device/driver"); err == nil {
		if drv, _ := os.Readlink("/sys/block/vda/device/driver"); filepath.Base(drv) == "virtio_blk" {
			check("virtio-blk disk", "/dev/vda", "vda", KindVirtio)
		}
	}
	if _, err := os.Stat("/sys/block/zram0"); err == nil {
		check("zram", "/dev/zram0", "zram0", KindOther)
	}

	var absent uint32
	for mnr := uint32(1<<20 - 1); ; mnr-- {
		if _, err := os.Lstat(fmt.Sprintf("/sys/dev/block/7:%d", mnr)); os.IsNotExist(err) {
			absent = mnr
			break
		}
	}
	if _, err := (Sysfs{}).Block(7, absent); !errors.Is(err, ErrNoBlockDevice) {
		t.Errorf("Block(7:%d) = %v; want ErrNoBlockDevice", absent, err)
	}
}

// TestBlockKinds decides the kinds that cannot run on this host (no NVMe, PMEM, SCSI, RBD or
// device-mapper here) from sysfs trees laid out as the kernel lays them out (the drivers'
// device_add_disk parents), partitions included.
func TestBlockKinds(t *testing.T) {
	root := t.TempDir()
	for _, d := range []sysfstree.Device{
		{Dir: "pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1", Major: 259, Minor: 0, Name: "nvme0n1",
			Parent: "pci0000:00/0000:00:04.0/nvme/nvme0", Subsystem: "class/nvme"},
		{Dir: "pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1", Major: 259, Minor: 1, Name: "nvme0n1p1",
			Files: map[string]string{"partition": "1\n"}},
		{Dir: "virtual/nvme-subsystem/nvme-subsys1/nvme1n1", Major: 259, Minor: 2, Name: "nvme1n1",
			Parent: "virtual/nvme-subsystem/nvme-subsys1", Subsystem: "class/nvme-subsystem"},
		{Dir: "LNXSYSTM:00/ndbus0/region0/namespace0.0/block/pmem0", Major: 259, Minor: 3, Name: "pmem0",
			Parent: "LNXSYSTM:00/ndbus0/region0/namespace0.0", Subsystem: "bus/nd"},
		{Dir: "pci0000:00/0000:00:05.0/virtio3/host0/target0:0:0/0:0:0:0/block/sda", Major: 8, Minor: 0, Name: "sda",
			Parent: "pci0000:00/0000:00:05.0/virtio3/host0/target0:0:0/0:0:0:0", Subsystem: "bus/scsi"},
		{Dir: "pci0000:00/0000:00:05.0/virtio3/host0/target0:0:0/0:0:0:0/block/sda/sda2", Major: 8, Minor: 2,
			Name: "sda2", Files: map[string]string{"partition": "2\n"}},
		{Dir: "pci0000:00/0000:00:06.0/virtio4/block/vdb", Major: 254, Minor: 16, Name: "vdb",
			Parent: "pci0000:00/0000:00:06.0/virtio4", Subsystem: "bus/virtio"},
		{Dir: "rbd/0/block/rbd0", Major: 251, Minor: 0, Name: "rbd0", Parent: "rbd/0", Subsystem: "bus/rbd"},
		{Dir: "virtual/block/dm-0", Major: 253, Minor: 0, Name: "dm-0",
			Files: map[string]string{"dm/name": "vg0-lv0\n", "dm/uuid": "LVM-x\n"}},
		{Dir: "virtual/block/md127", Major: 9, Minor: 127, Name: "md127", Files: map[string]string{"md/level": "raid1\n"}},
		{Dir: "virtual/block/loop4", Major: 7, Minor: 4, Name: "loop4"}, // nothing attached: no loop/ yet
		{Dir: "virtual/block/nbd0", Major: 43, Minor: 0, Name: "nbd0"},
		{Dir: "platform/mmc0/mmc0:0001/block/mmcblk0", Major: 179, Minor: 0, Name: "mmcblk0",
			Parent: "platform/mmc0/mmc0:0001", Subsystem: "bus/mmc"},
		{Dir: "virtual/block/evil", Major: 1, Minor: 99, Name: "../etc/passwd"},
	} {
		mustDo(t, sysfstree.Add(root, d))
	}

	for _, tc := range []struct {
		major, minor uint32
		names        []string
		kind         Kind
	}{
		{259, 0, []string{"nvme0n1"}, KindNVMe},
		{259, 1, []string{"nvme0n1p1"}, KindNVMe},
		{259, 2, []string{"nvme1n1"}, KindNVMe},
		{259, 3, []string{"pmem0"}, KindPMEM},
		{8, 0, []string{"sda"}, KindSCSI},
		{8, 2, []string{"sda2"}, KindSCSI},
		{254, 16, []string{"vdb"}, KindVirtio},
		{251, 0, []string{"rbd0"}, KindRBD},
		{253, 0, []string{"dm-0", "mapper/vg0-lv0"}, KindDM},
		{9, 127, []string{"md127"}, KindMD},
		{7, 4, []string{"loop4"}, KindLoop},
		{43, 0, []string{"nbd0"}, KindOther},
		{179, 0, []string{"mmcblk0"}, KindOther},
	} {
		bd, err := Sysfs{Root: root}.Block(tc.major, tc.minor)
		if err != nil {
			t.Errorf("%d:%d: %v", tc.major, tc.minor, err)
			continue
		}
		if bd.Kind != tc.kind || !slices.Equal(bd.Names, tc.names) {
			t.Errorf("%d:%d: %+v; want names %v, kind %s", tc.major, tc.minor, bd, tc.names, tc.kind)
		}
	}
	// a DEVNAME that would leave /dev is not taken
	if _, err := (Sysfs{Root: root}).Block(1, 99); err == nil || !strings.Contains(err.Error(), "not a name under /dev") {
		t.Errorf("a DEVNAME leaving /dev: %v", err)
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
