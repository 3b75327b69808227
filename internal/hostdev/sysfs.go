package hostdev

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Kind is a kind of block device, as the kernel describes it in sysfs: never as the device's name
// says.
type Kind string

// The kinds a block device can be. A partition is of its disk's kind.
const (
	KindLoop   Kind = "loop"   // a loop device (the kernel's loop major, 7)
	KindDM     Kind = "dm"     // device-mapper: LVM logical volumes, dm-crypt, multipath (a dm/ directory)
	KindMD     Kind = "md"     // software RAID (an md/ directory)
	KindNVMe   Kind = "nvme"   // an NVMe namespace (its parent is an nvme controller or subsystem)
	KindPMEM   Kind = "pmem"   // persistent memory (its parent is on the nd bus), virtio-pmem included
	KindVirtio Kind = "virtio" // virtio-blk (its parent is on the virtio bus)
	KindSCSI   Kind = "scsi"   // a SCSI disk (sd), virtio-scsi and iSCSI included
	KindRBD    Kind = "rbd"    // a Ceph RBD device (its parent is on the rbd bus)
	KindOther  Kind = "other"  // anything else: zram, nbd, mmc, ...
)

// Kinds are every Kind, in the order messages list them.
var Kinds = []Kind{KindLoop, KindDM, KindMD, KindNVMe, KindPMEM, KindVirtio, KindSCSI, KindRBD, KindOther}

// parentKinds maps the subsystem of a disk's parent device (the basename of <disk>/device/subsystem) to
// the disk's kind.
var parentKinds = map[string]Kind{
	"nvme": KindNVMe, "nvme-subsystem": KindNVMe,
	"nd":     KindPMEM,
	"virtio": KindVirtio,
	"scsi":   KindSCSI,
	"rbd":    KindRBD,
}

const loopMajor = 7 // LOOP_MAJOR, fixed in the kernel's include/uapi/linux/major.h

// ErrNoBlockDevice means the kernel has no block device with the number asked about.
var ErrNoBlockDevice = errors.New("the kernel has no block device with that number")

// BlockDevice is what the kernel says about a block device number.
type BlockDevice struct {
	// Name is the kernel's name for the device under /dev (uevent DEVNAME), such as "loop3", "dm-0" or
	// "nvme0n1p2".
	Name string
	// Names are every name under /dev the kernel gives the device: Name, and for a device-mapper device
	// also mapper/<its dm name> (the node libdevmapper makes when udev does not).
	Names []string
	// Major and Minor are its number.
	Major, Minor uint32
	// Kind is the device's kind; a partition has its disk's.
	Kind Kind
	// SysPath is the device's directory in sysfs, symlinks resolved.
	SysPath string
	// Bytes is the device's size (its size attribute, in 512-byte sectors, times 512); 0 when sysfs does
	// not say.
	Bytes int64
}

// Sysfs reads what the running kernel says about block devices.
type Sysfs struct {
	// Root is where sysfs is mounted; "" means /sys.
	Root string
	// Loops, when set, says what a loop device is attached to (for a tree of a test's, whose devices have
	// no nodes); nil means asking the kernel through the device's node under /dev (see Storage).
	Loops func(bd *BlockDevice) (LoopBacking, error)
}

// Block returns what the kernel says about block device major:minor, from <Root>/dev/block/MAJ:MIN. It
// wraps ErrNoBlockDevice when the kernel has no such device. It changes nothing.
func (s Sysfs) Block(major, minor uint32) (*BlockDevice, error) {
	root := s.Root
	if root == "" {
		root = "/sys"
	}
	link := filepath.Join(root, "dev", "block", fmt.Sprintf("%d:%d", major, minor))
	dir, err := filepath.EvalSymlinks(link)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%d:%d: %w", major, minor, ErrNoBlockDevice)
	}
	if err != nil {
		return nil, fmt.Errorf("block device %d:%d: %w", major, minor, err)
	}
	uevent, err := readUevent(filepath.Join(dir, "uevent"))
	if err != nil {
		return nil, fmt.Errorf("block device %d:%d: %w", major, minor, err)
	}
	name := uevent["DEVNAME"]
	if name == "" { // every block device has one; fall back on the directory's name all the same
		name = filepath.Base(dir)
	}
	if !validName(name) {
		return nil, fmt.Errorf("block device %d:%d: the kernel's name %q is not a name under /dev", major, minor, name)
	}
	d := &BlockDevice{Name: name, Names: []string{name}, Major: major, Minor: minor, SysPath: dir}
	if size, err := readLine(filepath.Join(dir, "size")); err == nil {
		if sectors, err := strconv.ParseInt(size, 10, 64); err == nil && sectors > 0 && sectors < 1<<54 {
			d.Bytes = sectors * 512
		}
	}

	disk := dir
	if exists(filepath.Join(dir, "partition")) {
		disk = filepath.Dir(dir)
	}
	if dmName, err := readLine(filepath.Join(dir, "dm", "name")); err == nil && validName(dmName) &&
		!strings.Contains(dmName, "/") {
		d.Names = append(d.Names, "mapper/"+dmName)
	}
	d.Kind, err = kindOf(disk)
	if err != nil {
		return nil, fmt.Errorf("block device %d:%d: %w", major, minor, err)
	}
	return d, nil
}

// Stack returns block device major:minor followed by every block device the kernel has built on it, each
// once: its partitions (the directories below its own that hold a "partition" file), the devices that hold
// it (its holders/ links: device-mapper, md), and, recursively, theirs. Writing to any of them writes to
// major:minor's blocks. It wraps ErrNoBlockDevice when the kernel has no device major:minor; a device
// built on it that goes away while Stack looks is left out. It changes nothing.
func (s Sysfs) Stack(major, minor uint32) ([]*BlockDevice, error) {
	first, err := s.Block(major, minor)
	if err != nil {
		return nil, err
	}
	stack := []*BlockDevice{first}
	seen := map[string]bool{first.SysPath: true}
	for i := 0; i < len(stack); i++ { // stack grows as it is walked
		built, err := builtOn(stack[i].SysPath)
		if err != nil {
			return nil, fmt.Errorf("the devices built on %s: %w", stack[i].Name, err)
		}
		for _, dir := range built {
			if seen[dir] {
				continue
			}
			seen[dir] = true
			bd, err := s.blockAt(dir)
			if errors.Is(err, ErrNoBlockDevice) {
				continue // gone meanwhile
			}
			if err != nil {
				return nil, fmt.Errorf("a device built on %s: %w", stack[i].Name, err)
			}
			stack = append(stack, bd)
		}
	}
	return stack, nil
}

// builtOn returns the sysfs directories, symlinks resolved, of the partitions and holders of the block
// device whose directory is dir.
func builtOn(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && exists(filepath.Join(dir, e.Name(), "partition")) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	holders, err := os.ReadDir(filepath.Join(dir, "holders"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, h := range holders {
		p, err := filepath.EvalSymlinks(filepath.Join(dir, "holders", h.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// blockAt is Block for the device whose sysfs directory is dir (its dev file gives the number). It wraps
// ErrNoBlockDevice when the device is gone.
func (s Sysfs) blockAt(dir string) (*BlockDevice, error) {
	dev, err := readLine(filepath.Join(dir, "dev"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoBlockDevice)
	}
	if err != nil {
		return nil, err
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(dev, "%d:%d", &major, &minor); err != nil {
		return nil, fmt.Errorf("%s/dev: %q is not a device number", dir, dev)
	}
	return s.Block(major, minor)
}

// kindOf decides the kind of the disk whose sysfs directory is disk.
func kindOf(disk string) (Kind, error) {
	dev, err := readLine(filepath.Join(disk, "dev"))
	if err != nil {
		return "", err
	}
	majorStr, _, _ := strings.Cut(dev, ":")
	if maj, err := strconv.ParseUint(majorStr, 10, 32); err == nil && maj == loopMajor {
		return KindLoop, nil
	}
	switch {
	case exists(filepath.Join(disk, "loop")):
		return KindLoop, nil
	case exists(filepath.Join(disk, "dm")):
		return KindDM, nil
	case exists(filepath.Join(disk, "md")):
		return KindMD, nil
	}
	sub, err := filepath.EvalSymlinks(filepath.Join(disk, "device", "subsystem"))
	if err != nil {
		return KindOther, nil // no parent device: a virtual disk such as zram or nbd
	}
	if k, ok := parentKinds[filepath.Base(sub)]; ok {
		return k, nil
	}
	return KindOther, nil
}

// ParseKind returns the Kind named s.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return "", fmt.Errorf("%q is not a kind of block device (%s)", s, strings.Join(names, ", "))
}

// validName accepts a relative name below /dev that stays there.
func validName(n string) bool {
	if n == "" || strings.HasPrefix(n, "/") {
		return false
	}
	for _, c := range strings.Split(n, "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}

func readUevent(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = v
		}
	}
	return out, sc.Err()
}

func readLine(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
