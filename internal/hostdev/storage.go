package hostdev

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// Extent is a range of storage: of a regular file, or of a block device's own blocks.
type Extent struct {
	// Base names the storage: "file MAJ:MIN:INO" for a regular file (the device number of its filesystem
	// and its inode), "block MAJ:MIN" for the blocks of a block device that is built on no other.
	Base string
	// Start is the range's first byte in Base; End the byte after its last, 0 meaning Base's end.
	Start, End int64
}

// overlaps says whether e and o share a byte.
func (e Extent) overlaps(o Extent) bool {
	end := func(x Extent) int64 {
		if x.End == 0 {
			return math.MaxInt64
		}
		return x.End
	}
	return e.Base == o.Base && e.Start < end(o) && o.Start < end(e)
}

// Storage is what a block device writes to, whatever it is named: two loop devices over one file, or a
// partition and its disk, write the same bytes. See Shares.
type Storage struct {
	// Own is the device's own storage: a range of its backing file for a loop device, a range of its disk's
	// storage for a partition, the device itself for anything else.
	Own Extent
	// Under is the storage of the devices it is built on (the slaves of a device-mapper or md device, and
	// theirs): it writes to some of it, which sysfs does not say.
	Under []Extent
}

// Shares reports whether writing through one of a and b may change what the other reads: their own
// storage overlaps, or one's own storage overlaps what lies under the other. Two devices both built on a
// third (two logical volumes of one volume group) do not share for that alone: each writes its own part.
func (a *Storage) Shares(b *Storage) bool {
	if a.Own.overlaps(b.Own) {
		return true
	}
	for _, u := range b.Under {
		if a.Own.overlaps(u) {
			return true
		}
	}
	for _, u := range a.Under {
		if b.Own.overlaps(u) {
			return true
		}
	}
	return false
}

// Bases returns the Base of a's own storage and of what lies under it, each once, in order: two devices
// that share storage (Shares) have a base in common.
func (a *Storage) Bases() []string {
	bases := []string{a.Own.Base}
	for _, u := range a.Under {
		bases = append(bases, u.Base)
	}
	slices.Sort(bases)
	return slices.Compact(bases)
}

// String names the storage for messages.
func (a *Storage) String() string {
	if a.Own.Start == 0 && a.Own.End == 0 {
		return a.Own.Base
	}
	end := "end"
	if a.Own.End != 0 {
		end = strconv.FormatInt(a.Own.End, 10)
	}
	return fmt.Sprintf("%s bytes %d to %s", a.Own.Base, a.Own.Start, end)
}

// LoopBacking is what a loop device is attached to: its backing file and the range of it used.
type LoopBacking struct {
	// Device and Inode identify the backing file: the device number of its filesystem (as the kernel
	// encodes dev_t) and its inode.
	Device, Inode uint64
	// Offset is where the range starts; SizeLimit its length, 0 meaning to the file's end.
	Offset, SizeLimit uint64
}

// errUnbound means a loop device has no backing file.
var errUnbound = errors.New("the loop device has no backing file")

// maxStackDepth bounds how deep Storage follows devices built on devices.
const maxStackDepth = 16

// Storage returns what block device major:minor writes to (see the type). A loop device's backing file is
// asked of the kernel (LOOP_GET_STATUS64 on the device's node under /dev, checked to be that device), not
// read from its name; a partition's range comes from sysfs. It wraps ErrNoBlockDevice when the kernel has
// no device major:minor. It changes nothing.
func (s Sysfs) Storage(major, minor uint32) (*Storage, error) {
	bd, err := s.Block(major, minor)
	if err != nil {
		return nil, err
	}
	return s.storageOf(bd, 0)
}

// StorageOf returns what v's device writes to: Storage of its block device, or its file for a volume
// backed by a regular file.
func (s Sysfs) StorageOf(v *crustv1.Volume) (*Storage, error) {
	dn := v.GetDeviceNumber()
	if dn.GetInode() != 0 {
		return &Storage{Own: Extent{Base: fileBase(uint64(unix.Mkdev(dn.GetMajor(), dn.GetMinor())), dn.GetInode())}}, nil
	}
	return s.Storage(dn.GetMajor(), dn.GetMinor())
}

// NumberStorage is the storage of v as its device number alone tells it, for where sysfs is not asked:
// the same device is the same storage, and no other is.
func NumberStorage(v *crustv1.Volume) *Storage {
	dn := v.GetDeviceNumber()
	if dn.GetInode() != 0 {
		return &Storage{Own: Extent{Base: fileBase(uint64(unix.Mkdev(dn.GetMajor(), dn.GetMinor())), dn.GetInode())}}
	}
	return &Storage{Own: Extent{Base: fmt.Sprintf("block %d:%d", dn.GetMajor(), dn.GetMinor())}}
}

func fileBase(dev, ino uint64) string {
	return fmt.Sprintf("file %d:%d:%d", unix.Major(dev), unix.Minor(dev), ino)
}

func (s Sysfs) storageOf(bd *BlockDevice, depth int) (*Storage, error) {
	if depth > maxStackDepth {
		return nil, fmt.Errorf("%s: devices built on devices more than %d deep", bd.Name, maxStackDepth)
	}
	st := &Storage{Own: Extent{Base: fmt.Sprintf("block %d:%d", bd.Major, bd.Minor)}}
	if exists(filepath.Join(bd.SysPath, "partition")) {
		disk, err := s.blockAt(filepath.Dir(bd.SysPath))
		if err != nil {
			return nil, fmt.Errorf("the disk of partition %s: %w", bd.Name, err)
		}
		ds, err := s.storageOf(disk, depth+1)
		if err != nil {
			return nil, err
		}
		start, err := sectors(filepath.Join(bd.SysPath, "start"))
		if err != nil {
			return nil, fmt.Errorf("partition %s: %w", bd.Name, err)
		}
		size, err := sectors(filepath.Join(bd.SysPath, "size"))
		if err != nil {
			return nil, fmt.Errorf("partition %s: %w", bd.Name, err)
		}
		st.Own = Extent{Base: ds.Own.Base, Start: ds.Own.Start + start, End: ds.Own.Start + start + size}
		st.Under = ds.Under
		return st, nil
	}
	if bd.Kind == KindLoop {
		lb, err := s.loopBacking(bd)
		switch {
		case errors.Is(err, errUnbound):
		case err != nil:
			return nil, fmt.Errorf("the backing file of %s: %w", bd.Name, err)
		default:
			st.Own = Extent{Base: fileBase(lb.Device, lb.Inode), Start: int64(lb.Offset)}
			if lb.SizeLimit != 0 {
				st.Own.End = int64(lb.Offset + lb.SizeLimit)
			}
		}
	}
	slaves, err := os.ReadDir(filepath.Join(bd.SysPath, "slaves"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the devices under %s: %w", bd.Name, err)
	}
	for _, sl := range slaves {
		dir, err := filepath.EvalSymlinks(filepath.Join(bd.SysPath, "slaves", sl.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("the devices under %s: %w", bd.Name, err)
		}
		under, err := s.blockAt(dir)
		if errors.Is(err, ErrNoBlockDevice) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("a device under %s: %w", bd.Name, err)
		}
		us, err := s.storageOf(under, depth+1)
		if err != nil {
			return nil, err
		}
		st.Under = append(st.Under, us.Own)
		st.Under = append(st.Under, us.Under...)
	}
	return st, nil
}

// loopBacking asks the kernel what the loop device bd is attached to, through s.Loops when set.
func (s Sysfs) loopBacking(bd *BlockDevice) (LoopBacking, error) {
	if s.Loops != nil {
		return s.Loops(bd)
	}
	if s.Root != "" {
		return LoopBacking{}, errUnbound // a tree of a test's, whose devices have no nodes
	}
	f, err := os.OpenFile(filepath.Join("/dev", bd.Name), os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return LoopBacking{}, err
	}
	defer func() { _ = f.Close() }()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return LoopBacking{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != unix.Mkdev(bd.Major, bd.Minor) {
		return LoopBacking{}, fmt.Errorf("/dev/%s is not device %d:%d", bd.Name, bd.Major, bd.Minor)
	}
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if errors.Is(err, unix.ENXIO) {
		return LoopBacking{}, errUnbound
	}
	if err != nil {
		return LoopBacking{}, fmt.Errorf("LOOP_GET_STATUS64: %w", err)
	}
	return LoopBacking{Device: info.Device, Inode: info.Inode, Offset: info.Offset, SizeLimit: info.Sizelimit}, nil
}

// sectors reads a sysfs attribute in 512-byte sectors and returns it in bytes.
func sectors(path string) (int64, error) {
	line, err := readLine(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(line, 10, 64)
	if err != nil || n < 0 || n >= 1<<54 {
		return 0, fmt.Errorf("%s: %q is not a number of sectors", path, line)
	}
	return n * 512, nil
}
