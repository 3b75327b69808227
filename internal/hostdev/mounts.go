package hostdev

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// DefaultMountInfo is the mount table MountCheck reads unless told otherwise: the mounts of the calling
// process's mount namespace.
const DefaultMountInfo = "/proc/self/mountinfo"

// Mount is a mount of a block device.
type Mount struct {
	// Device is the device mounted: the one asked about, or a device built on it (see Sysfs.Stack).
	Device *BlockDevice
	// Point is where it is mounted.
	Point string
}

// MountCheck finds where block devices are mounted, so that crustd never hands a sandbox a device whose
// filesystem the host has mounted: one filesystem mounted by two kernels is corrupted.
type MountCheck struct {
	// Sysfs says which devices are built on a device.
	Sysfs Sysfs
	// MountInfo is the mount table read (the format of proc(5)'s mountinfo); "" means DefaultMountInfo.
	// Only the mounts of that table's mount namespace are seen.
	MountInfo string
}

// Mounts returns the mounts, in the mount table's order, of block device major:minor and of every device
// built on it (its partitions, the device-mapper and md devices that hold it, and theirs: Sysfs.Stack),
// then those of the devices that share its storage under another name (another loop device over its
// file, the disk of a partition, a device it is built on: Storage). A mount is one of a device when the
// table gives the device's number, or, for a filesystem that reports a number of its own (btrfs), when
// its source is one of the device's names under /dev. It wraps ErrNoBlockDevice when the kernel has no
// device major:minor. It changes nothing.
func (c MountCheck) Mounts(major, minor uint32) ([]Mount, error) {
	stack, err := c.Sysfs.Stack(major, minor)
	if err != nil {
		return nil, err
	}
	path := c.MountInfo
	if path == "" {
		path = DefaultMountInfo
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	infos, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var out []Mount
	var others []*mountinfo.Info
	for _, m := range infos {
		i := slices.IndexFunc(stack, func(bd *BlockDevice) bool { return mountOf(m, bd) })
		if i >= 0 {
			out = append(out, Mount{Device: stack[i], Point: m.Mountpoint})
		} else if m.Major != 0 { // a block device's number; 0 is the kernel's anonymous devices (tmpfs, proc, btrfs)
			others = append(others, m)
		}
	}
	more, err := c.otherNames(major, minor, others)
	return append(out, more...), err
}

// otherNames returns the mounts, among ms, of the devices that share storage with block device
// major:minor without being built on it (see Storage): another loop device over its file, the disk of a
// partition, a device it is built on. A mounted device whose storage cannot be told (its node gone, say)
// is passed over.
func (c MountCheck) otherNames(major, minor uint32, ms []*mountinfo.Info) ([]Mount, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	own, err := c.Sysfs.Storage(major, minor)
	if err != nil {
		return nil, err
	}
	type dev struct{ major, minor int }
	shares := map[dev]*BlockDevice{} // nil: does not share, or cannot be told
	var out []Mount
	for _, m := range ms {
		d := dev{m.Major, m.Minor}
		bd, seen := shares[d]
		if !seen {
			if st, err := c.Sysfs.Storage(uint32(m.Major), uint32(m.Minor)); err == nil && own.Shares(st) { //nolint:gosec // device numbers from the kernel's mount table
				bd, _ = c.Sysfs.Block(uint32(m.Major), uint32(m.Minor)) //nolint:gosec // as above
			}
			shares[d] = bd
		}
		if bd != nil {
			out = append(out, Mount{Device: bd, Point: m.Mountpoint})
		}
	}
	return out, nil
}

// mountOf says whether m mounts bd.
func mountOf(m *mountinfo.Info, bd *BlockDevice) bool {
	if m.Major == int(bd.Major) && m.Minor == int(bd.Minor) {
		return true
	}
	dev, ok := strings.CutPrefix(m.Source, "/dev/")
	return ok && slices.Contains(bd.Names, dev)
}

// maxNamed bounds how many mounts a refusal names.
const maxNamed = 3

// NotMounted returns nil when the host does not have v's block device mounted, nor any device built on it
// (see Mounts), and for a volume backed by a regular file (VOLUME_TYPE_FILE, or persistent memory in a
// file), which is not checked. Otherwise its error wraps errdefs.ErrFailedPrecondition and names the
// devices and where they are mounted (the first few); an error reading sysfs or the mount table wraps
// errdefs.ErrInternal. It changes nothing.
func (c MountCheck) NotMounted(v *crustv1.Volume) error {
	dn := v.GetDeviceNumber()
	if v.GetSpec().GetVolumeType() == crustv1.VolumeType_VOLUME_TYPE_FILE || dn.GetInode() != 0 {
		return nil
	}
	path := v.GetResolvedBackingPath()
	mounts, err := c.Mounts(dn.GetMajor(), dn.GetMinor())
	if errors.Is(err, ErrNoBlockDevice) {
		return fmt.Errorf("%s is device %d:%d, which the kernel no longer has: %w", path, dn.GetMajor(), dn.GetMinor(),
			errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return fmt.Errorf("cannot tell whether %s is mounted on the host: %v: %w", path, err, errdefs.ErrInternal)
	}
	if len(mounts) == 0 {
		return nil
	}
	named := make([]string, 0, maxNamed)
	for _, m := range mounts[:min(len(mounts), maxNamed)] {
		named = append(named, fmt.Sprintf("/dev/%s at %s", m.Device.Name, m.Point))
	}
	if more := len(mounts) - maxNamed; more > 0 {
		named = append(named, fmt.Sprintf("and %d more", more))
	}
	return fmt.Errorf("%s is in use by the host, which has mounted %s: a filesystem mounted by the host and a sandbox at once is "+
		"corrupted, so crustd hands out a device only while the host has neither it, nor a partition or "+
		"device-mapper/md device built on it, nor another name of its storage (another loop device over its "+
		"file, its disk, a device under it) mounted; unmount it first (a CSI driver that defers to crust "+
		"neither formats nor mounts a deferred volume in NodeStageVolume): %w",
		path, strings.Join(named, ", "), errdefs.ErrFailedPrecondition)
}
