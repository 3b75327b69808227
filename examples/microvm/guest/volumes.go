//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	crustvolume "crust.dev/crust/api/volume"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

const (
	// defaultDeviceWait bounds the wait for a hot-plugged disk to show in the guest when the host names no
	// bound: a TCG guest on a busy two-core host has taken more than 10 s to probe one disk of several
	// hot-plugged at once (Kubernetes' storage suite, several raw block volumes in one pod).
	defaultDeviceWait = time.Minute
	maxDeviceWait     = 5 * time.Minute
	// growWait bounds the wait for a disk to show a resize done by the host.
	growWait = 10 * time.Second
	// maxSerial is virtio-blk's serial length (VIRTIO_BLK_ID_BYTES).
	maxSerial = 20
)

// volume is a disk the agent mounted.
type volume struct {
	serial   string
	device   string // /dev/vdX
	fsType   string
	readOnly bool
	block    bool // a raw block volume: a device node at the target, nothing mounted
	// Of an encrypted volume: the dm-crypt mapping's name and node, its key (to resize the mapping) and
	// whether dm-integrity lies under it; mapping is "" for a volume that is not encrypted.
	mapping, mapped string
	key             []byte
	integrity       bool
}

// volumes mounts, measures and grows the hot-plugged disks. Mount, unmount
// and grow are serialised; statfs is not, so a slow filesystem operation does
// not hold up measurements.
type volumes struct {
	procs *procTable
	ready func(context.Context) error // waits for the kernel modules

	op sync.Mutex // serialises mount, unmount and grow

	mu     sync.Mutex
	byPath map[string]*volume // by target
}

func newVolumes(procs *procTable, ready func(context.Context) error) *volumes {
	return &volumes{procs: procs, ready: ready, byPath: make(map[string]*volume)}
}

func (v *volumes) lookup(target string) *volume {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.byPath[target]
}

func (v *volumes) set(target string, vol *volume) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if vol == nil {
		delete(v.byPath, target)
	} else {
		v.byPath[target] = vol
	}
}

func checkTarget(target string) error {
	if !filepath.IsAbs(target) || filepath.Clean(target) != target || target == "/" {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "target %q is not a clean absolute path below /", target)
	}
	return nil
}

func (v *volumes) mount(ctx context.Context, args *agentv1.MountRequest) (res *agentv1.MountResponse, err error) {
	if args.Block {
		if args.Encryption != nil {
			return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "encryption of a raw block volume (the container gets the disk)")
		}
		return v.expose(ctx, args)
	}
	if args.FsType == "" {
		args.FsType = crustvolume.DefaultFSType
	}
	if err := checkTarget(args.Target); err != nil {
		return nil, err
	}
	switch {
	case args.Serial == "" || len(args.Serial) > maxSerial:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "serial %q must be 1 to %d bytes", args.Serial, maxSerial)
	case !crustvolume.IsFormattedFSType(args.FsType):
		return nil, agentproto.Errorf(errdefs.ErrUnimplemented, "fs type %q (supported: %s)", args.FsType,
			strings.Join(crustvolume.FormattedFSTypes(), ", "))
	case agentv1.FsGroupPolicy_name[int32(args.FsGroupPolicy)] == "":
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "fs_group_policy %d", args.FsGroupPolicy)
	case args.FsGroup != nil && (*args.FsGroup < 0 || *args.FsGroup > 1<<32-2):
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "fs_group %d", *args.FsGroup)
	case args.DeviceWaitMillis < 0:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "negative device wait")
	}
	flags, data, err := mountOptions(args.Options, args.ReadOnly, args.FsType)
	if err != nil {
		return nil, err
	}
	wait := min(time.Duration(args.DeviceWaitMillis)*time.Millisecond, maxDeviceWait)
	if wait == 0 {
		wait = defaultDeviceWait
	}

	// Filesystem modules load in the background at boot; wait for them
	// only when this filesystem is not in yet.
	if !fsAvailable(args.FsType) {
		if err := v.ready(ctx); err != nil {
			return nil, err
		}
	}
	v.op.Lock()
	defer v.op.Unlock()
	start := time.Now()
	var dev string
	if args.PmemAddress != 0 {
		dev, err = waitPmem(ctx, args.PmemAddress, wait)
		data = strings.Join(append(slices.DeleteFunc(strings.Split(data, ","), func(o string) bool { return o == "" }), "dax"), ",")
	} else {
		dev, err = waitDisk(ctx, args.Serial, wait, v.held())
	}
	if err != nil {
		return nil, err
	}
	found := time.Since(start)
	res = &agentv1.MountResponse{Device: dev}
	vol := &volume{serial: args.Serial, device: dev, fsType: args.FsType, readOnly: args.ReadOnly}
	if args.Encryption != nil {
		if vol.mapped, res.Formatted, err = v.openCrypt(ctx, dev, args); err != nil {
			return nil, err
		}
		vol.mapping, vol.key, vol.integrity = "crust-"+args.Serial, args.Encryption.Key, args.Encryption.Integrity
		defer func() {
			if err != nil { // a mapping left open would hold the disk
				_ = v.closeCrypt(context.WithoutCancel(ctx), vol.mapping)
			}
		}()
		dev = vol.mapped
	}

	// Already mounted there? Then it is the same disk or a conflict.
	if mi, ok := findMount(args.Target); ok {
		if sameDevice(mi.source, dev) {
			vol.fsType = mi.fsType
			v.set(args.Target, vol)
			res.Already = true
			return res, nil
		}
		return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s is already a mount of %s", args.Target, mi.source)
	}

	// blkid runs only when a blank disk may have to be formatted (or to
	// explain a failed mount): it costs a process start.
	if args.CreateFilesystem {
		found, err := v.probe(ctx, dev)
		if err != nil {
			return nil, err
		}
		switch {
		case strings.HasPrefix(found, "partition table"):
			return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s (serial %s) holds a %s, not a filesystem", dev, args.Serial, found)
		case found != "":
			// A filesystem (or another signature) is there: never format.
		case args.ReadOnly:
			return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s (serial %s) is blank and the volume is read-only", dev, args.Serial)
		default:
			if err := v.mkfs(ctx, args.FsType, dev, args.PmemAddress != 0); err != nil {
				return nil, err
			}
			res.Formatted = true
		}
	}

	if err := os.MkdirAll(args.Target, 0o755); err != nil {
		return nil, fmt.Errorf("%v", err)
	}
	// The filesystem's size, read before it is mounted: a disk grown while no sandbox held the volume
	// (an expansion before any claim) is grown into once mounted, as kubelet has a node plugin do at stage.
	var fsBytes, block uint64
	growable := !args.ReadOnly && !res.Formatted
	if growable {
		var err error
		if fsBytes, block, err = crustvolume.FilesystemBytes(dev, args.FsType); err != nil {
			growable = false // the mount below says what the disk holds
		}
	}
	if err := unix.Mount(dev, args.Target, args.FsType, flags, data); err != nil {
		return nil, v.mountFailure(ctx, dev, args, err)
	}
	if growable {
		grew, err := v.growToDisk(ctx, dev, args.FsType, args.Target, fsBytes, block)
		if err != nil {
			_ = unix.Unmount(args.Target, 0)
			return nil, err
		}
		if grew {
			res.GrewFromBytes = fsBytes
		}
	}
	if args.FsGroup != nil && !args.ReadOnly {
		policy := args.FsGroupPolicy
		if policy == agentv1.FsGroupPolicy_FS_GROUP_POLICY_UNSPECIFIED {
			policy = agentv1.FsGroupPolicy_FS_GROUP_POLICY_ALWAYS
		}
		if err := applyFSGroup(args.Target, int(*args.FsGroup), policy); err != nil {
			_ = unix.Unmount(args.Target, 0)
			return nil, fmt.Errorf("fs_group: %v", err)
		}
	}
	v.set(args.Target, vol)
	logger.Printf("mounted %s (serial %s, %s) on %s in %d ms, %d ms of it waiting for the device", dev, args.Serial,
		args.FsType, args.Target, time.Since(start).Milliseconds(), found.Milliseconds())
	return res, nil
}

// mountFailure explains a failed mount with what the disk holds.
func (v *volumes) mountFailure(ctx context.Context, dev string, args *agentv1.MountRequest, err error) error {
	if args.PmemAddress != 0 && errors.Is(err, unix.EINVAL) {
		// DAX maps file data page by page: a filesystem whose blocks are not a page refuses it.
		if _, block, berr := crustvolume.FilesystemBytes(dev, args.FsType); berr == nil && block != uint64(os.Getpagesize()) {
			return agentproto.Errorf(errdefs.ErrFailedPrecondition, "mount %s on %s with DAX: its %s has %d-byte "+
				"blocks, and DAX needs blocks of a page (%d bytes): make it with 4 KiB blocks (mkfs.ext4 -b 4096)",
				dev, args.Target, args.FsType, block, os.Getpagesize())
		}
	}
	found, perr := v.probe(ctx, dev)
	switch {
	case perr != nil:
	case found == "":
		return agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s (serial %s) has no filesystem and create_filesystem is off", dev, args.Serial)
	case found != args.FsType:
		return agentproto.Errorf(errdefs.ErrFailedPrecondition, "mount %s on %s: %v: the disk holds %s, not %s", dev, args.Target, err, found, args.FsType)
	}
	return fmt.Errorf("mount %s (%s) on %s: %v", dev, args.FsType, args.Target, err)
}

// fsAvailable reports whether the kernel knows fsType already.
func fsAvailable(fsType string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == fsType {
			return true
		}
	}
	return false
}

// waitDisk waits up to wait for the virtio disk with the given serial and returns its device node. held
// maps the device nodes the agent holds to their volumes' serials: a held disk's serial is read only when
// it is the one asked for, or on the last look before giving up (findDisk).
func waitDisk(ctx context.Context, serial string, wait time.Duration, held map[string]string) (string, error) {
	return waitDevice(ctx, wait, func(last bool) (string, bool) { return findDisk(serial, held, last) },
		func() error {
			return agentproto.Errorf(errdefs.ErrNotFound, "no disk with serial %q after %s", serial, wait)
		})
}

// waitPmem waits up to wait for the persistent-memory device whose region starts at guest physical
// address addr and returns its block device node (/dev/pmemN).
func waitPmem(ctx context.Context, addr uint64, wait time.Duration) (string, error) {
	return waitDevice(ctx, wait, func(bool) (string, bool) { return findPmem(addr) },
		func() error {
			return agentproto.Errorf(errdefs.ErrNotFound, "no persistent-memory region at %#x after %s", addr, wait)
		})
}

// waitDevice looks for a device with find, again on each kernel uevent (onUevents), until it is found,
// wait has passed (the error missing makes) or ctx ends.
func waitDevice(ctx context.Context, wait time.Duration, find func(last bool) (string, bool), missing func() error) (string, error) {
	var dev string
	err := onUevents(ctx, wait, "block", func(last bool) (ok bool, _ error) {
		dev, ok = find(last)
		return ok, nil
	})
	if errors.Is(err, errWaitPassed) {
		return "", missing()
	}
	return dev, err
}

// findPmem finds the block device of the nd region that starts at addr: the device the hot-plug made,
// whatever number the kernel gave it.
func findPmem(addr uint64) (string, bool) {
	regions, _ := filepath.Glob("/sys/bus/nd/devices/region*/resource")
	for _, f := range regions {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		start, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 64)
		if err != nil || start != addr {
			continue
		}
		blocks, _ := filepath.Glob(filepath.Join(filepath.Dir(f), "namespace*", "block", "pmem*"))
		for _, blk := range blocks {
			dev := "/dev/" + filepath.Base(blk)
			if _, err := os.Stat(dev); err == nil {
				return dev, true
			}
		}
	}
	return "", false
}

// findDisk returns the device node of the virtio-blk disk whose serial is serial. Reading a disk's
// serial is a request to the device (the driver asks it with VIRTIO_BLK_T_GET_ID, a round trip through
// QEMU), so only the disks that can be the one asked for are read: those the agent does not hold, and a
// held one whose volume has this serial (a mount of the same disk again). held maps device nodes to
// their volumes' serials. A look that is the last reads every disk, in case the agent's record of a disk
// is stale. So a mount reads about one serial rather than one for every disk in the guest, while it
// waits for the disk to appear too: reading every disk made a mount's time grow with the disks attached
// (docs/performance.md, "Many volumes").
func findDisk(serial string, held map[string]string, last bool) (string, bool) {
	entries, _ := os.ReadDir("/sys/block")
	var disks []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "vd") {
			disks = append(disks, e.Name())
		}
	}
	var files []string
	for _, name := range diskCandidates(disks, held, serial, last) {
		files = append(files, "/sys/block/"+name+"/serial")
	}
	return firstWithAttr(files, serial)
}

// diskCandidates returns the names among disks (such as vda) that may hold serial: those whose node
// (/dev/NAME) is not in held, then the held ones whose serial is serial, then, when all is set, the other
// held ones; the order of disks is otherwise kept.
func diskCandidates(disks []string, held map[string]string, serial string, all bool) []string {
	rank := func(name string) int {
		s, ok := held["/dev/"+name]
		switch {
		case !ok:
			return 0
		case s == serial:
			return 1
		case all:
			return 2
		}
		return -1
	}
	out := make([]string, 0, len(disks))
	for r := range 3 {
		for _, name := range disks {
			if rank(name) == r {
				out = append(out, name)
			}
		}
	}
	return out
}

// held returns the device nodes of the volumes mounted or exposed, with their serials.
func (v *volumes) held() map[string]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	devs := make(map[string]string, len(v.byPath))
	for _, vol := range v.byPath {
		devs[vol.device] = vol.serial
	}
	return devs
}

// sameDevice reports whether two paths name the same block device.
func sameDevice(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return a == b
	}
	return sa.Mode&unix.S_IFMT == unix.S_IFBLK && sa.Rdev == sb.Rdev
}

// probe returns what blkid finds on dev: a filesystem type, "partition table
// TYPE", or "" for a disk without any signature.
func (v *volumes) probe(ctx context.Context, dev string) (string, error) {
	res, err := v.procs.run(ctx, []string{"blkid", "-p", "-o", "export", dev}, time.Minute)
	if err != nil {
		return "", err
	}
	switch res.status {
	case 0:
	case 2: // nothing found
		return "", nil
	default:
		return "", fmt.Errorf("blkid %s exited with %d: %s", dev, res.status, res.stderr)
	}
	kv := map[string]string{}
	for _, line := range strings.Split(string(res.stdout), "\n") {
		if k, val, ok := strings.Cut(line, "="); ok {
			kv[k] = val
		}
	}
	switch {
	case kv["TYPE"] != "":
		return kv["TYPE"], nil
	case kv["PTTYPE"] != "":
		return "partition table " + kv["PTTYPE"], nil
	}
	return "unknown signature", nil
}

// mkfs formats dev with fsType; for DAX (persistent memory) with blocks of a page, which DAX needs.
func (v *volumes) mkfs(ctx context.Context, fsType, dev string, dax bool) error {
	var argv []string
	switch fsType {
	case "xfs":
		argv = []string{"mkfs.xfs", "-q", dev}
	default: // ext2/3/4; no blocks reserved for root, as is usual for volumes
		argv = []string{"mke2fs", "-q", "-F", "-t", fsType, "-m", "0", dev}
		if dax {
			argv = slices.Insert(argv, len(argv)-1, "-b", "4096")
		}
	}
	start := time.Now()
	if _, err := v.procs.runTool(ctx, argv...); err != nil {
		return err
	}
	logger.Printf("created %s on %s in %.2fs", fsType, dev, time.Since(start).Seconds())
	return nil
}

// mountFlags are the mount options that are flags of mount(2); any other
// option goes to the filesystem as data.
var mountFlags = map[string]struct {
	set   bool
	flags uintptr
}{
	"ro": {true, unix.MS_RDONLY}, "rw": {false, unix.MS_RDONLY},
	"nosuid": {true, unix.MS_NOSUID}, "suid": {false, unix.MS_NOSUID},
	"nodev": {true, unix.MS_NODEV}, "dev": {false, unix.MS_NODEV},
	"noexec": {true, unix.MS_NOEXEC}, "exec": {false, unix.MS_NOEXEC},
	"sync": {true, unix.MS_SYNCHRONOUS}, "async": {false, unix.MS_SYNCHRONOUS},
	"dirsync": {true, unix.MS_DIRSYNC},
	"noatime": {true, unix.MS_NOATIME}, "atime": {false, unix.MS_NOATIME},
	"nodiratime": {true, unix.MS_NODIRATIME}, "diratime": {false, unix.MS_NODIRATIME},
	"relatime": {true, unix.MS_RELATIME}, "norelatime": {false, unix.MS_RELATIME},
	"strictatime": {true, unix.MS_STRICTATIME},
	"lazytime":    {true, unix.MS_LAZYTIME}, "nolazytime": {false, unix.MS_LAZYTIME},
	"defaults": {true, 0},
}

// mountOptions splits options into mount(2) flags and filesystem data; a read-only mount (readOnly, or
// "ro" among options) of fsType gets the option that keeps it from replaying the journal
// (crustvolume.ReadOnlyOptions).
func mountOptions(options []string, readOnly bool, fsType string) (uintptr, string, error) {
	var flags uintptr
	var data []string
	for _, o := range options {
		switch {
		case o == "":
			continue
		case strings.ContainsAny(o, ", \t\n"):
			return 0, "", agentproto.Errorf(errdefs.ErrInvalidArgument, "mount option %q", o)
		case o == "bind" || o == "rbind" || o == "remount" || o == "move":
			return 0, "", agentproto.Errorf(errdefs.ErrInvalidArgument, "mount option %q is not for a volume", o)
		}
		if f, ok := mountFlags[o]; ok {
			if f.set {
				flags |= f.flags
			} else {
				flags &^= f.flags
			}
			continue
		}
		data = append(data, o)
	}
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if flags&unix.MS_RDONLY != 0 {
		data = append(data, crustvolume.ReadOnlyOptions(fsType, data)...)
	}
	return flags, strings.Join(data, ","), nil
}

func (v *volumes) unmount(target string) error {
	if err := checkTarget(target); err != nil {
		return err
	}
	v.op.Lock()
	defer v.op.Unlock()
	if vol := v.lookup(target); vol != nil && vol.block {
		return v.unexpose(target)
	}
	if _, ok := findMount(target); ok {
		if err := unix.Unmount(target, 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return agentproto.Errorf(errdefs.ErrFailedPrecondition, "unmount %s: %v", target, err)
			}
			return fmt.Errorf("unmount %s: %v", target, err)
		}
		logger.Printf("unmounted %s", target)
	}
	if vol := v.lookup(target); vol != nil && vol.mapping != "" && !v.mappedElsewhere(target, vol.mapping) {
		if err := v.closeCrypt(context.Background(), vol.mapping); err != nil {
			return err
		}
	}
	v.set(target, nil)
	return nil
}

// mappedElsewhere reports whether a volume at another target than target lies on the mapping name.
func (v *volumes) mappedElsewhere(target, name string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for t, vol := range v.byPath {
		if t != target && vol.mapping == name {
			return true
		}
	}
	return false
}

// unmountAll unmounts every volume, for power-off; failures are logged.
func (v *volumes) unmountAll() {
	v.mu.Lock()
	targets := slices.Collect(maps.Keys(v.byPath))
	v.mu.Unlock()
	for _, t := range targets {
		if err := v.unmount(t); err != nil {
			logger.Printf("%v", err)
		}
	}
}

func (v *volumes) statfs(target string) (*agentv1.StatfsResponse, error) {
	if err := checkTarget(target); err != nil {
		return nil, err
	}
	if vol := v.lookup(target); vol != nil && vol.block {
		return blockStatfs(vol), nil
	}
	mi, ok := findMount(target)
	if !ok {
		return nil, agentproto.Errorf(errdefs.ErrNotFound, "nothing is mounted on %s", target)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %v", target, err)
	}
	bsize := uint64(st.Frsize)
	if bsize == 0 {
		bsize = uint64(st.Bsize)
	}
	res := &agentv1.StatfsResponse{
		Bytes: &agentv1.Usage{
			Total:     st.Blocks * bsize,
			Used:      (st.Blocks - st.Bfree) * bsize,
			Available: st.Bavail * bsize,
		},
		Inodes: &agentv1.Usage{
			Total:     st.Files,
			Used:      st.Files - st.Ffree,
			Available: st.Ffree,
		},
	}
	vol := v.lookup(target)
	dev := mi.source
	if vol != nil {
		dev = vol.device
	}
	if strings.HasPrefix(dev, "/dev/vd") || strings.HasPrefix(dev, "/dev/pmem") {
		if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev))); err != nil {
			res.Abnormal, res.Message = true, fmt.Sprintf("device %s is gone", dev)
			return res, nil
		}
	}
	if vol != nil && !vol.readOnly && st.Flags&unix.ST_RDONLY != 0 {
		res.Abnormal, res.Message = true, fmt.Sprintf("%s is read-only though mounted read-write (filesystem errors?)", target)
	}
	return res, nil
}

func (v *volumes) grow(ctx context.Context, args *agentv1.GrowRequest) (*agentv1.GrowResponse, error) {
	if err := checkTarget(args.Target); err != nil {
		return nil, err
	}
	v.op.Lock()
	defer v.op.Unlock()
	if vol := v.lookup(args.Target); vol != nil && vol.block {
		return blockGrow(ctx, vol, args)
	}
	mi, ok := findMount(args.Target)
	if !ok {
		return nil, agentproto.Errorf(errdefs.ErrNotFound, "nothing is mounted on %s", args.Target)
	}
	dev, fsType := mi.source, mi.fsType
	if vol := v.lookup(args.Target); vol != nil {
		dev = vol.device
		if vol.readOnly {
			return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "%s is mounted read-only", args.Target)
		}
	}
	size, err := waitDeviceSize(ctx, dev, args.MinDeviceBytes, growWait)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if vol := v.lookup(args.Target); vol != nil && vol.mapping != "" {
		if err := v.resizeCrypt(ctx, vol); err != nil {
			return nil, err
		}
		dev = vol.mapped
	}
	if err := v.growFS(ctx, fsType, dev, args.Target); err != nil {
		return nil, err
	}
	st, err := v.statfs(args.Target)
	if err != nil {
		return nil, err
	}
	logger.Printf("grew %s (%s) to %d bytes in %.2fs", args.Target, fsType, st.Bytes.Total, time.Since(start).Seconds())
	return &agentv1.GrowResponse{DeviceBytes: size, CapacityBytes: st.Bytes.Total}, nil
}

// growFS grows the filesystem mounted on target from dev to fill dev, online.
func (v *volumes) growFS(ctx context.Context, fsType, dev, target string) error {
	var err error
	switch fsType {
	case "ext2", "ext3", "ext4":
		_, err = v.procs.runTool(ctx, "resize2fs", dev)
	case "xfs":
		_, err = v.procs.runTool(ctx, "xfs_growfs", "-d", target)
	default:
		err = agentproto.Errorf(errdefs.ErrUnimplemented, "growing %s", fsType)
	}
	return err
}

// growToDisk grows the filesystem just mounted on target, of fsBytes in blocks of block bytes, to fill
// dev when dev holds more than one block beyond it, and says whether it did.
func (v *volumes) growToDisk(ctx context.Context, dev, fsType, target string, fsBytes, block uint64) (bool, error) {
	size, err := deviceSize(dev)
	if err != nil || size <= fsBytes+block {
		return false, err
	}
	start := time.Now()
	if err := v.growFS(ctx, fsType, dev, target); err != nil {
		return false, err
	}
	logger.Printf("grew %s (%s) on %s from %d bytes to its disk's %d at mount in %.2fs", target, fsType, dev, fsBytes, size,
		time.Since(start).Seconds())
	return true, nil
}

// waitDeviceSize waits up to wait for dev to report at least atLeast bytes and returns its size. It reads
// the size again on each kernel uevent (a resized disk announces its new size), not on a clock.
func waitDeviceSize(ctx context.Context, dev string, atLeast uint64, wait time.Duration) (uint64, error) {
	var size uint64
	err := onUevents(ctx, wait, "block", func(bool) (ok bool, err error) {
		size, err = deviceSize(dev)
		return err == nil && size >= atLeast, err
	})
	if errors.Is(err, errWaitPassed) {
		return 0, agentproto.Errorf(context.DeadlineExceeded, "%s is %d bytes, still under %d after %s", dev, size, atLeast, wait)
	}
	return size, err
}

// deviceSize returns the size in bytes the kernel gives the block device dev now; a device that is gone
// is ErrNotFound.
func deviceSize(dev string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "size"))
	if err != nil {
		return 0, agentproto.Errorf(errdefs.ErrNotFound, "size of %s: %v", dev, err)
	}
	sectors, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %v", dev, err)
	}
	return sectors * 512, nil
}
