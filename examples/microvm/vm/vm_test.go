package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/initramfs"
	"crust.dev/crust/examples/microvm/internal/disktest"
	"crust.dev/crust/internal/testutil/harness"
)

// The tests here boot real QEMU guests (TCG) with the kernel and tools
// hack/guest/fetch-kernel.sh gathers, in CRUST_GUEST_ASSETS or else
// _output/guest at the top of the repository (beside go.work). They build crust-guest and the
// initramfs themselves, once.

const mib = 1 << 20

var (
	buildOnce sync.Once
	buildDir  string
	built     initramfs.Assets
	builtRD   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func assetsDir() string {
	if d := os.Getenv("CRUST_GUEST_ASSETS"); d != "" {
		return d
	}
	dir, _ := os.Getwd()
	for ; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return filepath.Join(dir, "_output", "guest")
		}
	}
	return "_output/guest"
}

// guestImages skips the test when QEMU or the guest assets are missing, and
// returns the kernel and a freshly built initramfs.
func guestImages(t *testing.T) (kernel, initrd string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the VM tests need root (loop devices, mounts)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("skipping: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
	}
	assets, err := initramfs.LoadAssets(assetsDir(), "cloud")
	if err != nil {
		t.Skipf("skipping: no guest assets (run hack/guest/fetch-kernel.sh): %v", err)
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "crust-vm-test-")
		if buildErr != nil {
			return
		}
		agent := filepath.Join(buildDir, "crust-guest")
		cmd := exec.Command("go", "build", "-o", agent, "crust.dev/crust/examples/microvm/cmd/crust-guest")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building crust-guest: %v\n%s", err, out)
			return
		}
		builtRD = filepath.Join(buildDir, "initramfs.cpio")
		buildErr = initramfs.Guest{Agent: agent, Modules: assets.Modules, Tools: assets.Tools}.WriteFile(builtRD)
		built = assets
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built.Kernel, builtRD
}

// loop is a loop device on a sparse file.
type loop struct{ path, file string }

// detach detaches the loop device and checks that none is left on its file.
func (l loop) detach(t *testing.T) {
	t.Helper()
	harness.Run(t, "losetup", "-d", l.path)
	if left := harness.Run(t, "losetup", "-j", l.file); left != "" {
		t.Errorf("loop device left on %s: %s", l.file, left)
	}
}

// loopDevice makes a sparse file of size bytes, formats it with mkfs (unless
// nil) and attaches it to a loop device, detached at cleanup if the test
// did not.
func loopDevice(t *testing.T, size int64, mkfs ...string) loop {
	t.Helper()
	file := disktest.Image(t, size, mkfs...)
	dev := harness.Run(t, "losetup", "--find", "--show", file)
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return loop{path: dev, file: file}
}

// growInVM grows l's file to size bytes, has the loop device and then QEMU's disk id take the new size.
func (l loop) growInVM(ctx context.Context, t *testing.T, v *VM, id string, size int64) {
	t.Helper()
	if err := os.Truncate(l.file, size); err != nil {
		t.Fatal(err)
	}
	harness.Run(t, "losetup", "--set-capacity", l.path)
	if err := v.ResizeBlock(ctx, id, size); err != nil {
		t.Fatal(err)
	}
}

func startVM(t *testing.T, cfg Config) *VM {
	t.Helper()
	cfg.Kernel, cfg.Initramfs = guestImages(t)
	cfg.StateDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := v.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			if b, err := os.ReadFile(v.ConsoleLog()); err == nil {
				t.Logf("console:\n%s", b)
			}
		}
	})
	return v
}

// tcgGuest boots a TCG guest for the test (startVM) and returns it with a context that ends timeout after
// the boot began, or with the test.
func tcgGuest(t *testing.T, timeout time.Duration) (context.Context, *VM) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx, startVM(t, Config{Accel: AccelTCG})
}

func execOK(t *testing.T, v *VM, argv ...string) string {
	t.Helper()
	res, err := v.Agent().Exec(context.Background(), &agentv1.ExecRequest{Argv: argv, TimeoutMillis: 60000})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	if res.ExitStatus != 0 {
		t.Fatalf("exec %q: exit %d: %s%s", argv, res.ExitStatus, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// hostStatfs mounts dev on the host and measures it as the agent does. It
// mounts read-write as the guest did: xfs sets its block reserve aside only
// on a writable mount.
func hostStatfs(t *testing.T, dev, fsType string) (*agentv1.StatfsResponse, uint64) {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(dev, dir, fsType, 0, ""); err != nil {
		t.Fatalf("host mount %s: %v", dev, err)
	}
	defer func() { _ = unix.Unmount(dir, 0) }()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	b := uint64(st.Frsize)
	return &agentv1.StatfsResponse{
		Bytes:  &agentv1.Usage{Total: st.Blocks * b, Used: (st.Blocks - st.Bfree) * b, Available: st.Bavail * b},
		Inodes: &agentv1.Usage{Total: st.Files, Used: st.Files - st.Ffree, Available: st.Ffree},
	}, b
}

func within(a, b, tol uint64) bool {
	if a > b {
		return a-b <= tol
	}
	return b-a <= tol
}

// TestVolumesInGuest boots one TCG guest and takes ext4 and xfs volumes on
// real loop devices through their life: hot-plug, mount (with mkfs for a
// blank one), fsGroup, writes, stats against the host's, online growth,
// read-only, a vanished device, exec, detach and stop.
func TestVolumesInGuest(t *testing.T) {
	ctx, v := tcgGuest(t, 5*time.Minute)
	boot := v.Boot()
	t.Logf("boot (TCG, QEMU start to agent answer): %s, kernel %s", boot.Took.Round(time.Millisecond), boot.Kernel)
	agent := v.Agent()

	extDev := loopDevice(t, 64*mib, "mkfs.ext4", "-q", "-F")
	xfsDev := loopDevice(t, 512*mib) // blank: the guest formats it
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	roDev := loopDevice(t, 16*mib, "mkfs.ext4", "-q", "-F", "-d", src)

	gid := int64(2000)
	// Hot-plug to mounted, timed.
	t0 := time.Now()
	if err := v.AttachBlock(ctx, "vol-ext4", extDev.path, false); err != nil {
		t.Fatal(err)
	}
	res, err := agent.Mount(ctx, &agentv1.MountRequest{
		Serial: "vol-ext4", FsType: "ext4", Target: "/volumes/ext4", Options: []string{"noatime"},
		FsGroup: &gid, FsGroupPolicy: agentv1.FsGroupPolicy_FS_GROUP_POLICY_ON_ROOT_MISMATCH,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hot-plug to mounted (ext4, existing fs): %s (%s)", time.Since(t0).Round(time.Millisecond), res.Device)

	t0 = time.Now()
	if err := v.AttachBlock(ctx, "vol-xfs", xfsDev.path, false); err != nil {
		t.Fatal(err)
	}
	res, err = agent.Mount(ctx, &agentv1.MountRequest{
		Serial: "vol-xfs", FsType: "xfs", Target: "/volumes/xfs", CreateFilesystem: true,
		FsGroup: &gid, FsGroupPolicy: agentv1.FsGroupPolicy_FS_GROUP_POLICY_ALWAYS,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Formatted {
		t.Error("blank xfs disk was not formatted")
	}
	t.Logf("hot-plug to mounted (xfs, mkfs in the guest): %s (%s)", time.Since(t0).Round(time.Millisecond), res.Device)

	// Mounting again is a no-op.
	if res, err := agent.Mount(ctx, &agentv1.MountRequest{Serial: "vol-ext4", Target: "/volumes/ext4"}); err != nil || !res.Already {
		t.Fatalf("second mount = %+v, %v", res, err)
	}
	// A disk without a filesystem is not formatted unless asked.
	if err := v.AttachBlock(ctx, "vol-ro", roDev.path, true); err != nil {
		t.Fatal(err)
	}

	// fsGroup: the roots carry the group, setgid and group rwx.
	for _, dir := range []string{"/volumes/ext4", "/volumes/xfs"} {
		if got := execOK(t, v, "stat", "-c", "%g %a", dir); got != "2000 2775" {
			t.Errorf("%s: gid and mode %q, want 2000 2775", dir, got)
		}
	}

	// Write data, then a file created later inherits the group.
	for _, dir := range []string{"/volumes/ext4", "/volumes/xfs"} {
		execOK(t, v, "sh", "-c", "dd if=/dev/urandom of="+dir+"/data bs=1M count=8 2>/dev/null && touch "+dir+"/new && sync")
		if got := execOK(t, v, "stat", "-c", "%g", dir+"/new"); got != "2000" {
			t.Errorf("%s/new has gid %s, want 2000 (setgid directory)", dir, got)
		}
	}
	sumBefore := execOK(t, v, "md5sum", "/volumes/ext4/data")

	// Grow both online: host file and loop device first, then QEMU, then the fs.
	for _, g := range []struct {
		id     string
		dev    loop
		target string
		size   int64
	}{
		{"vol-ext4", extDev, "/volumes/ext4", 64 * mib},
		{"vol-xfs", xfsDev, "/volumes/xfs", 512 * mib},
	} {
		before, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: g.target})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		g.dev.growInVM(ctx, t, v, g.id, 2*g.size)
		gr, err := agent.Grow(ctx, &agentv1.GrowRequest{Target: g.target, MinDeviceBytes: uint64(2 * g.size)})
		if err != nil {
			t.Fatal(err)
		}
		after, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: g.target})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("grow %s %d -> %d MiB online: %s; fs %d -> %d bytes", g.id, g.size/mib, 2*g.size/mib,
			time.Since(t0).Round(time.Millisecond), before.GetBytes().GetTotal(), after.GetBytes().GetTotal())
		if gr.DeviceBytes != uint64(2*g.size) || gr.CapacityBytes != after.GetBytes().GetTotal() {
			t.Errorf("grow %s = %+v, statfs total %d", g.id, gr, after.GetBytes().GetTotal())
		}
		// The filesystem's overhead does not double, so the new total is
		// more than twice the old minus a little.
		if after.GetBytes().GetTotal() < 2*before.GetBytes().GetTotal()-uint64(g.size)/20 || after.GetBytes().GetTotal() > uint64(2*g.size) {
			t.Errorf("grow %s: total %d -> %d for a device of %d", g.id, before.GetBytes().GetTotal(), after.GetBytes().GetTotal(), 2*g.size)
		}
	}
	if sum := execOK(t, v, "md5sum", "/volumes/ext4/data"); sum != sumBefore {
		t.Errorf("data changed across growth: %s, was %s", sum, sumBefore)
	}

	// Read-only: reads work, writes fail, and stats are normal.
	if _, err := agent.Mount(ctx, &agentv1.MountRequest{Serial: "vol-ro", Target: "/volumes/ro", ReadOnly: true, FsGroup: &gid}); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, v, "cat", "/volumes/ro/hello"); got != "from the host" {
		t.Errorf("read-only volume: hello = %q", got)
	}
	wr, err := agent.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"touch", "/volumes/ro/x"}})
	if err != nil {
		t.Fatal(err)
	}
	if wr.ExitStatus == 0 || !strings.Contains(string(wr.Stderr), "Read-only") {
		t.Errorf("write to the read-only volume: exit %d, stderr %q", wr.ExitStatus, wr.Stderr)
	}
	if st, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: "/volumes/ro"}); err != nil || st.GetAbnormal() {
		t.Errorf("read-only volume stats = %+v, %v", st, err)
	}
	// A device that vanishes under a mount makes the volume abnormal.
	if err := v.DetachBlock(ctx, "vol-ro"); err != nil {
		t.Fatal(err)
	}
	if st, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: "/volumes/ro"}); err != nil || !st.GetAbnormal() {
		t.Errorf("stats after the device left = %+v, %v; want abnormal", st, err)
	} else {
		t.Logf("vanished device: %s", st.Message)
	}
	if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: "/volumes/ro"}); err != nil {
		t.Error(err)
	}

	// A filesystem that turned read-only under a read-write mount (as ext4
	// does on errors with errors=remount-ro) is abnormal.
	execOK(t, v, "mount", "-o", "remount,ro", "/volumes/ext4")
	if st, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: "/volumes/ext4"}); err != nil || !st.GetAbnormal() {
		t.Errorf("stats of a read-only-turned volume = %+v, %v; want abnormal", st, err)
	} else {
		t.Logf("read-only-turned volume: %s", st.Message)
	}
	execOK(t, v, "mount", "-o", "remount,rw", "/volumes/ext4")

	// exec: output, status, timeout.
	if got := execOK(t, v, "uname", "-r"); got != boot.Kernel {
		t.Errorf("uname -r = %q, ping said %q", got, boot.Kernel)
	}
	er, err := agent.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"sh", "-c", "echo oops >&2; exit 7"}})
	if err != nil || er.ExitStatus != 7 || string(er.Stderr) != "oops\n" {
		t.Errorf("exec exit 7 = %+v, %v", er, err)
	}
	er, err = agent.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"sleep", "30"}, TimeoutMillis: 200})
	if err != nil || !er.TimedOut {
		t.Errorf("exec with timeout = %+v, %v", er, err)
	}

	// Stats: measure in the guest, unmount, measure the same fs on the host.
	// Both sides measure a fresh mount: after an online grow, ext4 keeps the
	// delayed-allocation reserve it computed for the old size until the next
	// mount, so "available" would differ by that much.
	type measured struct {
		dev    loop
		fsType string
		guest  *agentv1.StatfsResponse
	}
	var ms []measured
	for _, m := range []struct {
		serial, target string
		dev            loop
		fsType         string
	}{
		{"vol-ext4", "/volumes/ext4", extDev, "ext4"},
		{"vol-xfs", "/volumes/xfs", xfsDev, "xfs"},
	} {
		if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: m.target}); err != nil {
			t.Fatal(err)
		}
		if _, err := agent.Mount(ctx, &agentv1.MountRequest{Serial: m.serial, FsType: m.fsType, Target: m.target}); err != nil {
			t.Fatal(err)
		}
		st, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: m.target})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetAbnormal() || st.GetBytes().GetUsed() < 8*mib || st.GetInodes().GetUsed() == 0 {
			t.Errorf("%s stats = %+v", m.target, st)
		}
		if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: m.target}); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, measured{m.dev, m.fsType, st})
	}
	if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: "/volumes/ext4"}); err != nil {
		t.Errorf("unmounting twice: %v", err)
	}
	if _, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: "/volumes/ext4"}); err == nil {
		t.Error("statfs of an unmounted target succeeded")
	}
	for _, id := range []string{"vol-ext4", "vol-xfs"} {
		t0 := time.Now()
		if err := v.DetachBlock(ctx, id); err != nil {
			t.Fatal(err)
		}
		t.Logf("detach %s: %s", id, time.Since(t0).Round(time.Millisecond))
	}
	for _, m := range ms {
		host, block := hostStatfs(t, m.dev.path, m.fsType)
		g := m.guest
		if !within(g.GetBytes().GetTotal(), host.GetBytes().GetTotal(), block) || !within(g.GetBytes().GetUsed(), host.GetBytes().GetUsed(), block) ||
			!within(g.GetBytes().GetAvailable(), host.GetBytes().GetAvailable(), block) || g.GetInodes().GetTotal() != host.GetInodes().GetTotal() {
			t.Errorf("%s: guest stats %+v, host %+v (block %d)", m.fsType, g, host, block)
		} else {
			t.Logf("%s: guest and host agree: bytes %+v inodes %+v", m.fsType, g.Bytes, g.Inodes)
		}
	}

	// Stop leaves nothing behind, and neither do the loop devices.
	for _, d := range []loop{extDev, xfsDev, roDev} {
		d.detach(t)
	}
	pid := v.Pid()
	t0 = time.Now()
	if err := v.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop: %s", time.Since(t0).Round(time.Millisecond))
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("QEMU (pid %d) still there after Stop: %v", pid, err)
	}
	for _, s := range []string{"qmp.sock", "agent.sock"} {
		if _, err := os.Stat(filepath.Join(v.cfg.StateDir, s)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", s, err)
		}
	}
}

// TestAutoAccel boots with AccelAuto and a short KVM timeout: where KVM
// works the guest runs on it, where it hangs or is missing the VM falls back
// to TCG. On the project's machines a KVM guest with QEMU's default CPU model
// hangs after the BIOS (with -cpu host QEMU aborts at once, the easy case),
// so the test asks for that model to take the hang path.
func TestAutoAccel(t *testing.T) {
	t0 := time.Now()
	v := startVM(t, Config{Accel: AccelAuto, KVMTimeout: 4 * time.Second, CPU: "qemu64"})
	b := v.Boot()
	t.Logf("auto: running on %s after %s in all (this boot %s); fallback: %q", b.Accel, time.Since(t0).Round(time.Millisecond), b.Took.Round(time.Millisecond), b.Fallback)
	if b.Accel == AccelTCG && b.Fallback == "" {
		t.Error("fell back to TCG without a reason")
	}
	// Asked to wait, the agent answers once its kernel modules are loaded.
	if h, err := v.Agent().Health(context.Background(), &agentv1.HealthRequest{WaitStarted: true}); err != nil {
		t.Fatal(err)
	} else if !h.GetStarted() {
		t.Errorf("health after waiting for the start: %v", h)
	}
	if err := v.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// shareFixture makes a temporary directory holding an empty file, img, to stand for the kernel and the
// initramfs, and a directory named share to share.
func shareFixture(t *testing.T, name string) (dir, img, share string) {
	t.Helper()
	dir = t.TempDir()
	img, share = filepath.Join(dir, "img"), filepath.Join(dir, name)
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, img, share
}

// TestHotplugPortArgs checks the root-bus addresses of the hot-plug root ports in QEMU's arguments: as
// many ports as asked for, each at its own address on a slot nothing else takes, function 0 of each slot
// multifunction, and the refusal of counts that do not fit, without booting a VM.
func TestHotplugPortArgs(t *testing.T) {
	dir, img, share := shareFixture(t, "share")
	for _, tc := range []struct {
		ports, shares, want int // want 0: refused
	}{
		{0, 0, 8}, {1, 0, 1}, {9, 0, 9}, {32, 0, 32}, {MaxHotplugPorts, 0, MaxHotplugPorts},
		{MaxHotplugPorts - portsPerSlot, 1, MaxHotplugPorts - portsPerSlot},
		{MaxHotplugPorts + 1, 0, 0}, {MaxHotplugPorts, 1, 0}, {-1, 0, 0},
	} {
		c := Config{Kernel: img, Initramfs: img, StateDir: filepath.Join(dir, "state"), HotplugPorts: tc.ports}
		for i := range tc.shares {
			c.Shares = append(c.Shares, Share{Tag: fmt.Sprintf("s%d", i), Path: share})
		}
		name := fmt.Sprintf("%d ports, %d shares", tc.ports, tc.shares)
		err := c.setDefaults()
		if tc.want == 0 {
			if err == nil {
				t.Errorf("%s: accepted", name)
			} else if !strings.Contains(err.Error(), fmt.Sprint(MaxHotplugPorts-tc.shares*portsPerSlot)) {
				t.Errorf("%s: the error does not name the limit: %v", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		// Every device placed explicitly on the root bus, by address, and the slots taken.
		at := map[string]string{}
		slots := map[int][]string{} // slot: the devices' options
		ports := 0
		args := c.args(AccelTCG)
		for i, a := range args {
			if a != "-device" || !strings.Contains(args[i+1], "bus=pcie.0") {
				continue
			}
			dev := args[i+1]
			var addr string
			for _, opt := range strings.Split(dev, ",") {
				if v, ok := strings.CutPrefix(opt, "addr="); ok {
					addr = v
				}
			}
			var slot, fn int
			if n, _ := fmt.Sscanf(addr, "0x%x.%d", &slot, &fn); n == 0 {
				t.Fatalf("%s: no address in %q", name, dev)
			}
			if prev, ok := at[fmt.Sprintf("%d.%d", slot, fn)]; ok {
				t.Errorf("%s: %q and %q share address %s", name, prev, dev, addr)
			}
			at[fmt.Sprintf("%d.%d", slot, fn)] = dev
			if slot < 1 || slot > 30 || fn > 7 {
				t.Errorf("%s: %q is at %s, a slot the machine's own devices take or none", name, dev, addr)
			}
			slots[slot] = append(slots[slot], dev)
			if strings.HasPrefix(dev, "pcie-root-port,") {
				ports++
			}
		}
		if ports != tc.want {
			t.Errorf("%s: %d root ports, want %d", name, ports, tc.want)
		}
		for slot, devs := range slots {
			if len(devs) > 1 && !strings.Contains(at[fmt.Sprintf("%d.0", slot)], "multifunction=on") {
				t.Errorf("%s: slot %d holds %d functions but function 0 is not multifunction: %q", name, slot, len(devs), at[fmt.Sprintf("%d.0", slot)])
			}
		}
		// The shares' devices, which QEMU places, need as many slots left free.
		if free := 30 - len(slots); free < tc.shares {
			t.Errorf("%s: %d slots left for the shares", name, free)
		}
	}
}

// TestShares checks the QEMU arguments of 9p shares and the refusal of bad
// ones, without booting a VM.
func TestShares(t *testing.T) {
	dir, img, share := shareFixture(t, "a,b")
	cfg := func(shares ...Share) Config {
		return Config{Kernel: img, Initramfs: img, StateDir: filepath.Join(dir, "state"), Shares: shares}
	}
	c := cfg(Share{Tag: "data", Path: share}, Share{Tag: "ro.1", Path: share, ReadOnly: true})
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(c.args(AccelTCG), " ")
	esc := strings.ReplaceAll(share, ",", ",,")
	for _, want := range []string{
		"-fsdev local,id=crust-fs0,path=" + esc + ",security_model=passthrough -device virtio-9p-pci,id=crust-9p0,fsdev=crust-fs0,mount_tag=data",
		"-fsdev local,id=crust-fs1,path=" + esc + ",security_model=passthrough,readonly=on -device virtio-9p-pci,id=crust-9p1,fsdev=crust-fs1,mount_tag=ro.1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q:\n%s", want, got)
		}
	}
	if c := cfg(); c.setDefaults() != nil || strings.Contains(strings.Join(c.args(AccelTCG), " "), "9p") {
		t.Error("a VM without shares has a 9p device")
	}
	for name, bad := range map[string][]Share{
		"empty tag":   {{Tag: "", Path: share}},
		"comma":       {{Tag: "a,b", Path: share}},
		"long tag":    {{Tag: strings.Repeat("a", 32), Path: share}},
		"twice":       {{Tag: "x", Path: share}, {Tag: "x", Path: dir}},
		"missing dir": {{Tag: "x", Path: filepath.Join(dir, "nope")}},
		"not a dir":   {{Tag: "x", Path: img}},
	} {
		if c := cfg(bad...); c.setDefaults() == nil {
			t.Errorf("%s: accepted %+v", name, bad)
		}
	}
}

// TestFSShares checks the QEMU and virtiofsd arguments of virtio-fs shares and the refusal of bad ones,
// without booting a VM.
func TestFSShares(t *testing.T) {
	dir, img, share := shareFixture(t, "share")
	cfg := func(shares ...FSShare) Config {
		return Config{Kernel: img, Initramfs: img, StateDir: filepath.Join(dir, "state"), VirtioFSD: "/bin/true",
			Shares: []Share{{Tag: "nine", Path: share}}, FSShares: shares}
	}
	c := cfg(FSShare{Tag: "vfs", Path: share, DaemonArgs: []string{"--thread-pool-size=1"}})
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(c.args(AccelTCG), " ")
	sock := filepath.Join(c.StateDir, "vfs0.sock")
	for _, want := range []string{
		"-object memory-backend-memfd,id=crust-ram,size=512M,share=on -numa node,memdev=crust-ram",
		"-chardev socket,id=crust-vfs0,path=" + sock + " -device vhost-user-fs-pci,id=crust-vfsdev0,chardev=crust-vfs0,tag=vfs,queue-size=1024",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q:\n%s", want, got)
		}
	}
	if d := strings.Join(c.virtiofsdArgs(0), " "); d != "--socket-path="+sock+" -o source="+share+" -o cache=auto --thread-pool-size=1" {
		t.Errorf("virtiofsd args = %s", d)
	}
	if c := cfg(); c.setDefaults() != nil || strings.Contains(strings.Join(c.args(AccelTCG), " "), "memfd") {
		t.Error("a VM without virtio-fs shares has shared memory")
	}
	for name, bad := range map[string][]FSShare{
		"empty tag":   {{Tag: "", Path: share}},
		"9p's tag":    {{Tag: "nine", Path: share}},
		"twice":       {{Tag: "x", Path: share}, {Tag: "x", Path: dir}},
		"cache":       {{Tag: "x", Path: share, Cache: "metadata"}},
		"missing dir": {{Tag: "x", Path: filepath.Join(dir, "nope")}},
		"not a dir":   {{Tag: "x", Path: img}},
	} {
		if c := cfg(bad...); c.setDefaults() == nil {
			t.Errorf("%s: accepted %+v", name, bad)
		}
	}
}
