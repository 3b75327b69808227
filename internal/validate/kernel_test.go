package validate

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev"
	"crust.dev/crust/internal/testutil"
)

// loopDev is a real loop device, attached to a small image for the whole test binary.
type loopDev struct {
	path         string // /dev/loopN
	major, minor uint32
}

func (l loopDev) mkdev() int { return int(unix.Mkdev(l.major, l.minor)) }
func (l loopDev) dn() *crustv1.DeviceNumber {
	return &crustv1.DeviceNumber{Major: l.major, Minor: l.minor}
}
func (l loopDev) String() string              { return fmt.Sprintf("%d:%d", l.major, l.minor) }
func (l loopDev) node(t testing.TB, p string) { must(t, unix.Mknod(p, unix.S_IFBLK|0o600, l.mkdev())) }
func blockNode(t testing.TB, p string, dev uint64) {
	must(t, unix.Mknod(p, unix.S_IFBLK|0o600, int(dev)))
}

var loopSet struct {
	once  sync.Once
	dir   string
	loops [3]loopDev
	err   error
}

// realLoops attaches three loop devices (once per test binary; TestMain detaches them) and returns them.
func realLoops(t testing.TB) [3]loopDev {
	t.Helper()
	testutil.RequireRoot(t, "for loop devices")
	loopSet.once.Do(func() {
		loopSet.dir, loopSet.err = os.MkdirTemp("", "crust-validate-loops")
		for i := range loopSet.loops {
			if loopSet.err != nil {
				return
			}
			img := filepath.Join(loopSet.dir, fmt.Sprintf("disk%d.img", i))
			if loopSet.err = os.WriteFile(img, make([]byte, 1<<20), 0o600); loopSet.err != nil {
				return
			}
			out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
			if err != nil {
				loopSet.err = fmt.Errorf("losetup: %v: %s", err, out)
				return
			}
			l := loopDev{path: strings.TrimSpace(string(out))}
			var st unix.Stat_t
			if loopSet.err = unix.Stat(l.path, &st); loopSet.err != nil {
				return
			}
			l.major, l.minor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
			loopSet.loops[i] = l
		}
	})
	if loopSet.err != nil {
		t.Fatal(loopSet.err)
	}
	return loopSet.loops
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, l := range loopSet.loops {
		if l.path != "" {
			_ = exec.Command("losetup", "-d", l.path).Run()
		}
	}
	if loopSet.dir != "" {
		_ = os.RemoveAll(loopSet.dir)
	}
	os.Exit(code)
}

// otherDisk returns a block device of the host that is not a loop device (the root disk, usually), with
// its number and kind, or skips.
func otherDisk(t *testing.T) (name string, dev uint64, kind hostdev.Kind) {
	t.Helper()
	ents, err := os.ReadDir("/sys/dev/block")
	must(t, err)
	var root unix.Stat_t
	must(t, unix.Stat("/", &root))
	names := []string{fmt.Sprintf("%d:%d", unix.Major(root.Dev), unix.Minor(root.Dev))} // the root disk first
	for _, e := range ents {
		names = append(names, e.Name())
	}
	for _, n := range names {
		var maj, mnr uint32
		if _, err := fmt.Sscanf(n, "%d:%d", &maj, &mnr); err != nil {
			continue
		}
		bd, err := (hostdev.Sysfs{}).Block(maj, mnr)
		if err != nil || bd.Kind == hostdev.KindLoop {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/dev/"+bd.Name, &st) != nil || st.Rdev != unix.Mkdev(maj, mnr) {
			continue
		}
		return bd.Name, unix.Mkdev(maj, mnr), bd.Kind
	}
	t.Skip("no block device but loop devices on this host")
	return "", 0, ""
}

// impostor returns a name under /dev that no device has, shaped like a loop device's.
func impostor(t *testing.T) string {
	t.Helper()
	p := fmt.Sprintf("/dev/loop%d", 900000+os.Getpid()%90000)
	_ = os.Remove(p)
	t.Cleanup(func() { _ = os.Remove(p) })
	return p
}

// A device node's name is a claim about which device it is: a node made by mknod with another device's
// number must not pass an allow-list written for the name. The kernel's name for the number
// (/sys/dev/block) decides: under /dev the node must carry it, elsewhere it must be allowed as well.
func TestDeviceNameIsTheKernels(t *testing.T) {
	loops := realLoops(t)
	loop, other := loops[0], loops[1]
	diskName, diskDev, _ := otherDisk(t)
	tmp := t.TempDir()
	// a block number no device has: the loop major with a minor far above any in use
	var absent uint64
	for mnr := uint32(1<<20 - 1); ; mnr-- {
		if _, err := os.Lstat(fmt.Sprintf("/sys/dev/block/7:%d", mnr)); os.IsNotExist(err) {
			absent = unix.Mkdev(7, mnr)
			break
		}
	}
	onlyLoops := []string{"/dev/loop*"}
	tmpAndLoops := []string{tmp + "/*", "/dev/loop*"}

	tests := []struct {
		name   string
		allow  []string
		setup  func(t *testing.T) string // returns the backing path
		want   *crustv1.DeviceNumber     // accepted with this number, or
		reason string                    // refused with this in the reason
	}{
		{name: "a real loop device", allow: onlyLoops,
			setup: func(*testing.T) string { return loop.path }, want: loop.dn()},
		{name: "a symlink to a real loop device", allow: onlyLoops, setup: func(t *testing.T) string {
			must(t, os.Symlink(loop.path, tmp+"/by-id-link"))
			return tmp + "/by-id-link"
		}, want: loop.dn()},
		{name: "a loop-named node in /dev with the root disk's number", allow: onlyLoops, setup: func(t *testing.T) string {
			p := impostor(t)
			blockNode(t, p, diskDev)
			return p
		}, reason: "which the kernel calls /dev/" + diskName},
		{name: "a loop-named node in /dev with another loop's number", allow: onlyLoops, setup: func(t *testing.T) string {
			p := impostor(t)
			other.node(t, p)
			return p
		}, reason: "which the kernel calls " + other.path},
		{name: "a second name in /dev for an allowed loop device", allow: onlyLoops, setup: func(t *testing.T) string {
			p := impostor(t)
			loop.node(t, p)
			return p
		}, reason: "which the kernel calls " + loop.path},
		{name: "a loop-named node in /dev with a number no device has", allow: []string{"/dev/*"}, setup: func(t *testing.T) string {
			p := impostor(t)
			blockNode(t, p, absent)
			return p
		}, reason: "which the kernel does not have"},
		{name: "a loop-named node in an allowed directory with the root disk's number", allow: tmpAndLoops,
			setup: func(t *testing.T) string {
				blockNode(t, tmp+"/loop99", diskDev)
				return tmp + "/loop99"
			}, reason: "which the kernel calls /dev/" + diskName + " (/sys/dev/block/"},
		{name: "a node in an allowed directory with a loop's number", allow: tmpAndLoops,
			setup: func(t *testing.T) string {
				loop.node(t, tmp+"/private")
				return tmp + "/private"
			}, want: loop.dn()},
		{name: "a node in an allowed directory whose kernel name is not allowed", allow: []string{tmp + "/*"},
			setup: func(t *testing.T) string {
				loop.node(t, tmp+"/private2")
				return tmp + "/private2"
			}, reason: "which the kernel calls " + loop.path + " (/sys/dev/block/" + loop.String() + "); that name matches none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := New(Config{KubeletDir: tmp, DeviceAllow: tc.allow})
			must(t, err)
			path := tc.setup(t)
			_, dn, err := v.Device("volume_backing_path", path, crustv1.VolumeType_VOLUME_TYPE_BLOCK)
			checkDevice(t, dn, err, tc.want, tc.reason)
		})
	}
}

// checkDevice checks Device's answer: accepted with number want, or refused as invalid input naming
// volume_backing_path with reason in it.
func checkDevice(t *testing.T, dn *crustv1.DeviceNumber, err error, want *crustv1.DeviceNumber, reason string) {
	t.Helper()
	if reason == "" {
		if err != nil || !proto.Equal(dn, want) {
			t.Fatalf("Device = %v, %v; want %v accepted", dn, err, want)
		}
		return
	}
	var fe *errdefs.FieldError
	if !errors.As(err, &fe) || fe.Field != "volume_backing_path" || !strings.Contains(fe.Reason, reason) {
		t.Fatalf("Device = %v, %v; want volume_backing_path refused with %q", dn, err, reason)
	}
}

// Operators may allow devices by kind; the kind comes from sysfs, never from the name the caller gave.
func TestDeviceAllowKind(t *testing.T) {
	loops := realLoops(t)
	loop := loops[0]
	diskName, diskDev, diskKind := otherDisk(t)
	tmp := t.TempDir()
	loop.node(t, tmp+"/dm-0")           // a loop device named like a device-mapper one
	blockNode(t, tmp+"/loop7", diskDev) // the disk named like a loop device
	image := tmp + "/image.img"
	must(t, os.WriteFile(image, make([]byte, 4096), 0o600))
	all := []string{"/dev/*", tmp + "/*"}

	tests := []struct {
		name   string
		kinds  []string
		path   string
		vtype  crustv1.VolumeType
		want   *crustv1.DeviceNumber
		reason string
	}{
		{name: "every kind by default", path: loop.path, want: loop.dn()},
		{name: "loop allowed", kinds: []string{"loop"}, path: loop.path, want: loop.dn()},
		{name: "loop among others", kinds: []string{"nvme", "loop", "dm"}, path: loop.path, want: loop.dn()},
		{name: "loop not allowed", kinds: []string{"dm", "nvme"}, path: loop.path,
			reason: "is a loop device (" + loop.path + ", as /sys/dev/block/" + loop.String() + " says), a kind " +
				"--device-allow-kind does not allow (it allows dm, nvme)"},
		{name: "named dm-0, a loop device all the same", kinds: []string{"dm"}, path: tmp + "/dm-0",
			reason: "is a loop device"},
		{name: "named like a loop, the disk's kind all the same", kinds: []string{"loop"}, path: tmp + "/loop7",
			reason: fmt.Sprintf("is a %s device (/dev/%s", diskKind, diskName)},
		{name: "the disk, its kind allowed", kinds: []string{string(diskKind)}, path: "/dev/" + diskName,
			want: &crustv1.DeviceNumber{Major: unix.Major(diskDev), Minor: unix.Minor(diskDev)}},
		{name: "the disk, only loop allowed", kinds: []string{"loop"}, path: "/dev/" + diskName,
			reason: fmt.Sprintf("is a %s device", diskKind)},
		{name: "image files have no kind", kinds: []string{"pmem"}, path: image,
			vtype: crustv1.VolumeType_VOLUME_TYPE_FILE},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := New(Config{KubeletDir: tmp, DeviceAllow: all, DeviceAllowKinds: tc.kinds, AllowFileBacked: true})
			must(t, err)
			vt := tc.vtype
			if vt == crustv1.VolumeType_VOLUME_TYPE_UNSPECIFIED {
				vt = crustv1.VolumeType_VOLUME_TYPE_BLOCK
			}
			_, dn, err := v.Device("volume_backing_path", tc.path, vt)
			if vt == crustv1.VolumeType_VOLUME_TYPE_FILE {
				if err != nil {
					t.Fatalf("Device(image) = %v", err)
				}
				return
			}
			checkDevice(t, dn, err, tc.want, tc.reason)
		})
	}

	if _, err := New(Config{KubeletDir: tmp, DeviceAllowKinds: []string{"floppy"}}); err == nil ||
		!strings.Contains(err.Error(), `"floppy" is not a kind of block device (loop, dm, md, nvme, pmem, virtio, scsi, rbd, other)`) {
		t.Errorf("New with an unknown kind: %v", err)
	}
}

// At claim time the same checks run on the staged device: a stricter kind list refuses it as a failed
// precondition, and the number recorded at stage is the one the kernel was asked about.
func TestSameDeviceChecksTheKernel(t *testing.T) {
	loops := realLoops(t)
	tmp := t.TempDir()
	v, err := New(Config{KubeletDir: tmp, DeviceAllow: []string{"/dev/loop*"}})
	must(t, err)
	resolved, dn, err := v.Device("volume_backing_path", loops[0].path, crustv1.VolumeType_VOLUME_TYPE_BLOCK)
	must(t, err)
	vol := &crustv1.Volume{
		Spec:                &crustv1.VolumeSpec{VolumeBackingPath: loops[0].path, VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK},
		ResolvedBackingPath: resolved, DeviceNumber: dn,
	}
	must(t, v.SameDevice(vol))
	strict, err := New(Config{KubeletDir: tmp, DeviceAllow: []string{"/dev/loop*"}, DeviceAllowKinds: []string{"nvme"}})
	must(t, err)
	err = strict.SameDevice(vol)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "is a loop device") {
		t.Fatalf("SameDevice with only nvme allowed = %v; want a failed precondition naming the kind", err)
	}
}
