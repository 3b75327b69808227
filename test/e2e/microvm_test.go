package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMHandler drives crust-microvm, the reference runtime handler, with crustd and crustctl: one VM
// with three volumes (ext4 staged after the VM started, a blank xfs formatted in the guest, a read-only
// ext4), then kill -9 and a second run of the same sandbox. Two VM boots in all (TCG).
//
// It checks: volumes are mounted in the guest, one staged late included; fsGroup (group and setgid on the
// root); read-only is honoured; online expansion N -> 2N of ext4 and xfs through crustctl expand, seen in
// the guest on the same mount with the data intact, and idempotent; after kill -9 QEMU is gone, crustd
// releases the dead handler's claims by itself, and a new run claims every volume again with nothing lost; exec relays output and status; stop leaves no process, socket or claim; and, on the host
// afterwards, the data written in the guest is on the devices and crustctl stats (measured in the guest,
// forwarded by crustd) match the host's statfs of the same filesystems within one block.
func TestMicroVMHandler(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	stateDir := t.TempDir()
	const name = "e2e-microvm"

	type vol struct {
		target, guest, dev, fsType, md5 string
		size                            int64
	}
	ext := vol{target: d.podTarget("3c9e0f1a-0000-4000-8000-00000000e2e1", "pvc-ext4"), guest: "/data/ext4", fsType: "ext4", size: 256 * mib}
	xfs := vol{target: d.podTarget("3c9e0f1a-0000-4000-8000-00000000e2e1", "pvc-xfs"), guest: "/data/xfs", fsType: "xfs", size: 512 * mib}
	ro := vol{target: d.podTarget("3c9e0f1a-0000-4000-8000-00000000e2e1", "pvc-ro"), guest: "/data/ro", fsType: "ext4", size: 32 * mib}
	ext.dev, xfs.dev, ro.dev = loopDevice(t, ext.size), loopDevice(t, xfs.size), loopDevice(t, ro.size)
	harness.Run(t, "mkfs.ext4", "-q", "-F", ext.dev)
	mkfsHello(t, ro.dev)

	stage := func(v vol, extra ...string) {
		t.Helper()
		d.crustctlOK(append([]string{"stage", "--target-path", v.target, "--device", v.dev, "--fs-type", v.fsType}, extra...)...)
	}
	stage(xfs, "--create-filesystem", "--fs-group", "3000")
	stage(ro, "--read-only", "--fs-group", "2000")
	volumes := []string{ext.target + ":" + ext.guest, xfs.target + ":" + xfs.guest, ro.target + ":" + ro.guest}

	// First run: boot, then stage ext4 while the VM runs.
	m := startMicroVM(t, d, assets, stateDir, name, volumes...)
	t.Logf("first run: VM up and serving %s after starting crust-microvm (boot in the log: %s)", m.Ready, m.LogValue("VM up", "boot"))
	mounted := m.WaitMountedAsync(ext.guest)
	t0 := time.Now()
	stage(ext, "--fs-group", "2000", "--fs-group-policy", "on_root_mismatch", "--mount-option", "noatime")
	if err := <-mounted; err != nil {
		t.Fatalf("the volume staged after boot was not mounted: %v", err)
	}
	t.Logf("staged after boot -> mounted in the guest: %s seen by the test (%s by the handler's clock)",
		time.Since(t0).Round(time.Millisecond), m.WaitLogValue("volume mounted", "since_staged", "target="+ext.target))
	for _, v := range []vol{xfs, ro} {
		if err := <-m.WaitMountedAsync(v.guest); err != nil {
			t.Fatalf("%s: %v", v.guest, err)
		}
	}
	if got := m.WaitLogValue("volume mounted", "formatted", "target="+xfs.target); got != "true" {
		t.Errorf("the blank xfs volume was not formatted in the guest (formatted=%q)", got)
	}

	// fsGroup: the root carries the group, the setgid bit and group rwx; new files inherit the group.
	for _, c := range []struct{ dir, want string }{{ext.guest, "2000 2775"}, {xfs.guest, "3000 2775"}} {
		if got := m.ExecOK("stat", "-c", "%g %a", c.dir); got != c.want {
			t.Errorf("%s: gid and mode %q, want %q", c.dir, got, c.want)
		}
	}
	// Data, written in the guest and synced.
	for _, v := range []*vol{&ext, &xfs} {
		out := m.ExecOK("sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=%[1]s/data bs=1M count=8 2>/dev/null && sync && md5sum %[1]s/data && stat -c %%g %[1]s/data", v.guest))
		f := strings.Fields(out)
		if len(f) != 3 {
			t.Fatalf("unexpected output %q", out)
		}
		v.md5 = f[0]
		if want := map[string]string{ext.guest: "2000", xfs.guest: "3000"}[v.guest]; f[2] != want {
			t.Errorf("%s/data has gid %s, want %s (setgid root)", v.guest, f[2], want)
		}
	}
	// Read-only: reads work, writes fail.
	if got := m.ExecOK("cat", ro.guest+"/hello"); got != "from the host" {
		t.Errorf("read-only volume: hello = %q", got)
	}
	if _, errOut, code := m.Exec("touch", ro.guest+"/x"); code == 0 || !strings.Contains(errOut, "Read-only") {
		t.Errorf("write to the read-only volume: exit %d, stderr %q", code, errOut)
	}

	// Online expansion N -> 2N: the host grows the backing file, crustctl expand does the rest.
	for _, v := range []vol{ext, xfs} {
		mountID := m.ExecOK("sh", "-c", fmt.Sprintf("awk '$5 == %q {print $1}' /proc/self/mountinfo", v.guest))
		before := statsOf(t, d, v.target)
		if err := os.Truncate(backingFile(t, v.dev), 2*v.size); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		out, errOut, code := d.crustctl("expand", v.target, "--size", strconv.FormatInt(2*v.size, 10), "-o", "json")
		if code != 0 {
			t.Fatalf("expand %s to %d: exit %d: %s", v.fsType, 2*v.size, code, errOut)
		}
		took := time.Since(t0)
		var r crustv1.ExpandVolumeResponse
		if err := protojson.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("expand output: %v\n%s", err, out)
		}
		after := statsOf(t, d, v.target)
		t.Logf("grow %s %d -> %d MiB online (crustctl expand, end to end): %s; filesystem %d -> %d bytes",
			v.fsType, v.size/mib, 2*v.size/mib, took.Round(time.Millisecond), before.total, after.total)
		if r.GetCapacityBytes() != after.total || after.total < 2*before.total-v.size/20 || after.total > 2*v.size {
			t.Errorf("%s: capacity %d, stats total %d -> %d, for a device of %d", v.fsType, r.GetCapacityBytes(), before.total, after.total, 2*v.size)
		}
		devSize := m.ExecOK("sh", "-c", fmt.Sprintf("blockdev --getsize64 $(awk '$2 == %q {print $1}' /proc/mounts)", v.guest))
		if devSize != strconv.FormatInt(2*v.size, 10) {
			t.Errorf("%s: the guest's disk is %s bytes, want %d", v.fsType, devSize, 2*v.size)
		}
		if id := m.ExecOK("sh", "-c", fmt.Sprintf("awk '$5 == %q {print $1}' /proc/self/mountinfo", v.guest)); id != mountID || id == "" {
			t.Errorf("%s: mount id %q before the expansion, %q after: it was remounted", v.fsType, mountID, id)
		}
		if sum := strings.Fields(m.ExecOK("md5sum", v.guest+"/data"))[0]; sum != v.md5 {
			t.Errorf("%s: data changed across the expansion", v.fsType)
		}
		// Repeating it is a success with the same capacity.
		out, errOut, code = d.crustctl("expand", v.target, "--size", strconv.FormatInt(2*v.size, 10), "-o", "json")
		var again crustv1.ExpandVolumeResponse
		if code != 0 || protojson.Unmarshal([]byte(out), &again) != nil || again.GetCapacityBytes() != r.GetCapacityBytes() {
			t.Errorf("repeated expand of %s: exit %d, %s%s", v.fsType, code, out, errOut)
		}
	}

	// XFS reads the inode limit from the on-disk superblock at mount, before it replays its log, so the
	// first mount after a crash would report the pre-grow limit until the next one (a kernel property,
	// which the handler reports as it is). Checkpoint the grow before the crash so that the second run's
	// stats can be compared with the host's below.
	m.ExecOK("sh", "-c", "fsfreeze --freeze "+xfs.guest+" && fsfreeze --unfreeze "+xfs.guest)

	// kill -9 of the handler while its volumes are attached.
	qemuPid := m.QemuPid()
	m.Kill()
	killed := time.Now()
	harness.Eventually(t, 10*time.Second, "QEMU to die with crust-microvm", func() bool { return !harness.ProcessAlive(qemuPid) })
	// crustd notices the dead handler (its process gone, its endpoint refusing) and releases its claims.
	harness.Eventually(t, 10*time.Second, "crustd to release the dead handler's claims", func() bool {
		for _, v := range []vol{ext, xfs, ro} {
			if getVolume(t, d, v.target).GetClaim() != nil {
				return false
			}
		}
		return true
	})
	t.Logf("kill -9 of the handler -> crustd released its 3 claims in %s", time.Since(killed).Round(time.Millisecond))

	// Second run, same name: it cleans the stale state and claims everything again.
	m = startMicroVM(t, d, assets, stateDir, name, volumes...)
	t.Logf("second run (after kill -9): serving after %s", m.Ready)
	if !strings.Contains(m.Log(), "cleaned up after an earlier run") {
		t.Errorf("the second run did not report cleaning the first one's state:\n%s", m.Log())
	}
	for _, v := range []vol{ext, xfs, ro} {
		if err := <-m.WaitMountedAsync(v.guest); err != nil {
			t.Fatalf("%s after restart: %v", v.guest, err)
		}
	}
	out, errOut, code := d.crustctl("ls", "-o", "json")
	var list crustv1.ListVolumesResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("ls: exit %d: %s%s", code, out, errOut)
	}
	if len(list.GetVolumes()) != 3 {
		t.Errorf("crustd holds %d descriptors, want 3", len(list.GetVolumes()))
	}
	for _, v := range list.GetVolumes() {
		if v.GetClaim().GetSandboxId() != name || !strings.HasSuffix(v.GetClaim().GetHandlerEndpoint(), "/handler.sock") {
			t.Errorf("%s: claim %v, want sandbox %s with its handler", v.GetSpec().GetVolumeTargetPath(), v.GetClaim(), name)
		}
	}
	for _, v := range []vol{ext, xfs} {
		if sum := strings.Fields(m.ExecOK("md5sum", v.guest+"/data"))[0]; sum != v.md5 {
			t.Errorf("%s: data lost across kill -9 and restart", v.fsType)
		}
	}
	// exec relays stdout, stderr and the exit status.
	if out, errOut, code := m.Exec("sh", "-c", "echo out; echo err >&2; exit 3"); out != "out\n" || errOut != "err\n" || code != 3 {
		t.Errorf("exec: stdout %q, stderr %q, exit %d; want out, err, 3", out, errOut, code)
	}

	// Stats measured in the guest, on a fresh mount (as the host's will be).
	guestStats := map[string]usage{}
	for _, v := range []vol{ext, xfs} {
		guestStats[v.target] = statsOf(t, d, v.target)
	}

	// stop: nothing left behind.
	m.Stop()
	if pid := m.QemuPidWas; harness.ProcessAlive(pid) {
		t.Errorf("QEMU (pid %d) still running after stop", pid)
	}
	if socks, _ := filepath.Glob(filepath.Join(stateDir, name, "*.sock")); len(socks) > 0 {
		t.Errorf("sockets left after stop: %v", socks)
	}
	for _, v := range []vol{ext, xfs, ro} {
		if c := getVolume(t, d, v.target).GetClaim(); c != nil {
			t.Errorf("%s still claimed after stop: %v", v.target, c)
		}
	}

	// On the host: the data is on the devices, and the guest's stats are the host's.
	for _, v := range []vol{ext, xfs} {
		host, block := hostStats(t, v.dev, v.fsType, v.guest, v.md5)
		g := guestStats[v.target]
		if !near(g.total, host.total, block) || !near(g.used, host.used, block) || !near(g.available, host.available, block) ||
			g.inodes != host.inodes || g.inodesUsed != host.inodesUsed {
			t.Errorf("%s: guest stats %+v, host %+v (block %d)", v.fsType, g, host, block)
		} else {
			t.Logf("%s: stats from the guest match the host's statfs: %+v", v.fsType, g)
		}
	}
}

// TestMicroVMSignalWhileBooting sends SIGTERM to `crust-microvm run` while its VM boots, as a runtime
// stopping a sandbox that is still starting would: it exits 0 and leaves no QEMU and no socket.
func TestMicroVMSignalWhileBooting(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	stateDir := t.TempDir()
	dir := filepath.Join(stateDir, "e2e-boot")
	var log strings.Builder
	cmd := exec.Command(filepath.Join(binDir, "crust-microvm"), "--state-dir", stateDir, "run", "--name", "e2e-boot",
		"--crust-socket", d.socket, "--accel", "tcg", "--assets", assets)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// QEMU creates its QMP socket at once; the guest answers seconds later.
	harness.Eventually(t, 30*time.Second, "QEMU to start", func() bool {
		_, err := os.Stat(filepath.Join(dir, "qmp.sock"))
		return err == nil
	})
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("crust-microvm run after SIGTERM while booting: %v\n%s", err, log.String())
	}
	t.Logf("SIGTERM while booting: exited 0 after %s", time.Since(t0).Round(time.Millisecond))
	if !strings.Contains(log.String(), "stopped while booting") {
		t.Errorf("the VM was not stopped while booting:\n%s", log.String())
	}
	if socks, _ := filepath.Glob(filepath.Join(dir, "*.sock")); len(socks) > 0 {
		t.Errorf("sockets left: %v", socks)
	}
	for _, p := range sandboxProcesses(dir) {
		t.Errorf("a process still uses the sandbox's state: %s", p)
	}
}

// newMicroVMDaemon returns a crustd of the test's own, started with extra flags, and the guest assets
// for crust-microvm (GuestAssets, made first: the test is skipped before crustd starts when the guest
// kernel cannot be fetched).
func newMicroVMDaemon(t *testing.T, extra ...string) (*daemon, string) {
	t.Helper()
	assets := harness.GuestAssets(t, binDir)
	return newDaemon(t, extra...), assets
}

// mkfsHello makes an ext4 filesystem on dev holding one file, hello, that says "from the host\n".
func mkfsHello(t *testing.T, dev string) {
	t.Helper()
	seed := t.TempDir()
	if err := os.WriteFile(filepath.Join(seed, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	harness.Run(t, "mkfs.ext4", "-q", "-F", "-d", seed, dev)
}

// startMicroVM starts `crust-microvm run` (TCG) for d's socket and waits until exec reaches its guest.
func startMicroVM(t *testing.T, d *daemon, assets, stateDir, name string, volumes ...string) *harness.MicroVM {
	t.Helper()
	return harness.StartMicroVM(t, harness.MicroVMConfig{Bin: filepath.Join(binDir, "crust-microvm"), StateDir: stateDir,
		Name: name, CrustSocket: d.socket, Assets: assets, Volumes: volumes})
}

// expandTo grows the loop device dev's file to size bytes, has crustd expand target to that size, and
// returns its stats then.
func expandTo(t *testing.T, d *daemon, target, dev string, size int64) usage {
	t.Helper()
	if err := os.Truncate(backingFile(t, dev), size); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := d.crustctl("expand", target, "--size", strconv.FormatInt(size, 10)); code != 0 {
		t.Fatalf("expand %s: exit %d: %s", target, code, errOut)
	}
	return statsOf(t, d, target)
}

// usage is a volume's usage in bytes and inodes.
type usage struct {
	total, used, available int64
	inodes, inodesUsed     int64
}

// statsOf returns `crustctl stats TARGET`, asking again for a while when the handler is UNAVAILABLE
// (crustd's connection to a restarted handler may still be backing off).
func statsOf(t *testing.T, d *daemon, target string) usage {
	t.Helper()
	ctx, cancel := harness.Context(t, 30*time.Second)
	defer cancel()
	var out, errOut string
	var code int
	_ = harness.Poll(ctx, func() (bool, error) {
		out, errOut, code = d.crustctl("stats", target, "-o", "json")
		return code == 0 || !strings.Contains(errOut, "Unavailable"), nil
	})
	if code != 0 {
		t.Fatalf("stats %s: exit %d: %s", target, code, errOut)
	}
	var r crustv1.GetVolumeStatsResponse
	if err := protojson.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("stats output: %v\n%s", err, out)
	}
	if r.GetVolumeCondition().GetAbnormal() {
		t.Errorf("%s is abnormal: %s", target, r.GetVolumeCondition().GetMessage())
	}
	return usageOf(r.GetUsage(), crustv1.VolumeUsage_UNIT_BYTES, crustv1.VolumeUsage_UNIT_INODES)
}

// usageEntry is one entry of a stats answer, crust's or CSI's: its unit and its three counts.
type usageEntry[U comparable] interface {
	GetUnit() U
	GetTotal() int64
	GetUsed() int64
	GetAvailable() int64
}

// usageOf reads a stats answer's entries: the one of unit bytes gives total, used and available, the one
// of unit inodes gives inodes and inodesUsed; an entry of another unit is passed over, and a missing
// one leaves its fields 0.
func usageOf[U comparable, E usageEntry[U]](entries []E, bytes, inodes U) usage {
	var u usage
	for _, x := range entries {
		switch x.GetUnit() {
		case bytes:
			u.total, u.used, u.available = x.GetTotal(), x.GetUsed(), x.GetAvailable()
		case inodes:
			u.inodes, u.inodesUsed = x.GetTotal(), x.GetUsed()
		}
	}
	return u
}

func getVolume(t *testing.T, d *daemon, target string) *crustv1.Volume {
	t.Helper()
	out := d.crustctlOK("get", target, "-o", "json")
	var v crustv1.Volume
	if err := protojson.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("get output: %v\n%s", err, out)
	}
	return &v
}

// hostStats mounts dev on the host (read-write, as the guest did: xfs sets its reserve aside only then),
// checks that guestPath's data file has the checksum the guest computed, and measures the filesystem as the
// guest agent does.
func hostStats(t *testing.T, dev, fsType, guestPath, md5 string) (usage, int64) {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(dev, dir, fsType, 0, ""); err != nil {
		t.Fatalf("host mount %s: %v", dev, err)
	}
	defer func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("host unmount %s: %v", dir, err)
		}
	}()
	out, err := exec.Command("md5sum", filepath.Join(dir, "data")).Output()
	if err != nil {
		t.Errorf("%s: reading the data written in the guest (%s): %v", fsType, guestPath, err)
	} else if sum := strings.Fields(string(out))[0]; sum != md5 {
		t.Errorf("%s: the data on the device has md5 %s, the guest wrote %s", fsType, sum, md5)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	b := st.Frsize
	return usage{
		total: int64(st.Blocks) * b, used: int64(st.Blocks-st.Bfree) * b, available: int64(st.Bavail) * b,
		inodes: int64(st.Files), inodesUsed: int64(st.Files - st.Ffree),
	}, b
}

func near(a, b, tol int64) bool { return max(a-b, b-a) <= tol }

func backingFile(t *testing.T, dev string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "BACK-FILE", dev).Output()
	if err != nil {
		t.Fatalf("losetup --list %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}
