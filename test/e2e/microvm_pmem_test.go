package e2e

import (
	"crypto/md5"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/internal/testutil/harness"
)

// statxAttrDAX is STATX_ATTR_DAX: the file's data is accessed directly in (persistent) memory, with no
// page cache.
const statxAttrDAX = 0x00200000

// TestMicroVMPmem runs persistent-memory volumes through crustd and crust-microvm in one TCG guest, each
// backed by a file (crustd --allow-file-backed):
//
//   - a read-write pmem volume with ext4 (4 KiB blocks) made on the host is attached as virtio-pmem and
//     mounted with DAX in effect: the guest's mount says dax, and statx says STATX_ATTR_DAX of a file
//     written there; data written and synced in the guest is in the backing file on the host after the
//     sandbox stops;
//   - crustctl stats is the file's size before the sandbox runs, then measured in the guest (through
//     crustd) and matches the host's statfs; crustctl
//     expand is UNIMPLEMENTED and changes neither the volume nor the file; crustctl get and ls -o wide
//     show the Kata caveat;
//   - a read-only pmem volume is mounted read-only in the guest;
//   - a backing whose size is no multiple of 2 MiB is refused at stage, naming the file;
//   - a pmem volume whose mount fails (no filesystem) stays in the VM, so its claim is kept while the VM
//     runs and released once it has stopped; the mounted ones are unmounted at stop and released only
//     after the VM is down.
func TestMicroVMPmem(t *testing.T) {
	assets := harness.GuestAssets(t, binDir)
	if mods, err := os.ReadFile(filepath.Join(assets, "cloud", "modules.load")); err != nil ||
		!slices.Contains(strings.Fields(string(mods)), "virtio_pmem.ko") {
		t.Fatalf("the guest kernel's modules (%s/cloud/modules.load) lack virtio_pmem (%v): make guest, or "+
			"hack/guest/fetch-kernel.sh into CRUST_GUEST_ASSETS", assets, err)
	}
	files := t.TempDir()
	d := newDaemon(t, "--allow-file-backed", "--device-allow", files+"/*")
	const name = "e2e-pmem"
	pod := "3c9e0f1a-0000-4000-8000-0000000e2e77"

	image := func(base string, size int64, seed string) string {
		t.Helper()
		p := filepath.Join(files, base)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		if seed != "" {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "hello"), []byte(seed), 0o644); err != nil {
				t.Fatal(err)
			}
			harness.Run(t, "mkfs.ext4", "-q", "-b", "4096", "-d", dir, p) // DAX needs blocks of a page
		}
		return p
	}
	rw, ro, blank := image("rw.pmem", 64*mib, "from the host\n"), image("ro.pmem", 32*mib, "read only\n"), image("blank.pmem", 16*mib, "")
	odd := image("odd.pmem", 5*mib, "")
	tRW, tRO, tBlank, tOdd := d.podTarget(pod, "pvc-rw"), d.podTarget(pod, "pvc-ro"), d.podTarget(pod, "pvc-blank"), d.podTarget(pod, "pvc-odd")
	stage := func(target, file string, extra ...string) (string, int) {
		t.Helper()
		_, errOut, code := d.crustctl(append([]string{"stage", "--target-path", target, "--device", file, "--fs-type", "ext4",
			"--volume-type", "pmem"}, extra...)...)
		return errOut, code
	}
	for _, s := range []struct {
		target, file string
		extra        []string
	}{{tRW, rw, nil}, {tRO, ro, []string{"--read-only"}}, {tBlank, blank, nil}} {
		if errOut, code := stage(s.target, s.file, s.extra...); code != 0 {
			t.Fatalf("stage %s: exit %d: %s", s.file, code, errOut)
		}
	}
	errOut, code := stage(tOdd, odd)
	if code == 0 || !strings.Contains(errOut, "InvalidArgument") || !strings.Contains(errOut, odd) ||
		!strings.Contains(errOut, "multiple of 2 MiB") {
		t.Errorf("stage of a 5 MiB pmem file: exit %d, %q; want INVALID_ARGUMENT naming the file and 2 MiB", code, errOut)
	}
	if _, _, code := d.crustctl("get", tOdd); code == 0 {
		t.Errorf("the refused pmem volume is staged all the same")
	}

	// Before any sandbox holds it, the stats are the backing's size.
	if st := statsOf(t, d, tRW); st.total != 64*mib {
		t.Errorf("stats of the unclaimed pmem volume: total %d, want the file's %d", st.total, 64*mib)
	}

	m := startMicroVM(t, d, assets, t.TempDir(), name, tRW+":/data/pmem", tRO+":/data/ro", tBlank+":/data/blank")
	for _, p := range []string{"/data/pmem", "/data/ro"} {
		if err := <-m.WaitMountedAsync(p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	t.Logf("pmem volume claimed, hot-plugged and mounted with DAX in %s (the handler's log: address %s, host persistent memory %s)",
		m.WaitLogValue("volume mounted", "took", "target="+tRW), m.WaitLogValue("volume mounted", "pmem_address", "target="+tRW),
		m.WaitLogValue("volume mounted", "host_pmem", "target="+tRW))

	// DAX in effect: the mount and statx say so.
	mount := strings.Fields(m.ExecOK("awk", `$2 == "/data/pmem" {print $1, $4}`, "/proc/mounts"))
	if len(mount) != 2 || !strings.HasPrefix(mount[0], "/dev/pmem") || !strings.Contains(","+mount[1]+",", ",dax=always,") {
		t.Errorf("/data/pmem in /proc/mounts: %q; want a /dev/pmemN mounted with dax=always", mount)
	}
	out := m.ExecOK("sh", "-c", "dd if=/dev/urandom of=/data/pmem/data bs=1M count=4 2>/dev/null && sync /data/pmem/data && md5sum /data/pmem/data")
	guestMD5 := strings.Fields(out)[0]
	attrs := harness.StatxAttributes(t, m.ExecOK("xfs_io", "-r", "-c", "statx -r", "/data/pmem/data"))
	if attrs&statxAttrDAX == 0 {
		t.Errorf("statx attributes of /data/pmem/data are %#x: STATX_ATTR_DAX is not set", attrs)
	}
	t.Logf("guest: %s mounted %s; statx attributes of a file there %#x (STATX_ATTR_DAX %#x)", mount[0], mount[1], attrs, statxAttrDAX)

	// Read-only.
	if got := m.ExecOK("cat", "/data/ro/hello"); got != "read only" {
		t.Errorf("/data/ro/hello = %q", got)
	}
	if opts := m.ExecOK("awk", `$2 == "/data/ro" {print $4}`, "/proc/mounts"); !strings.HasPrefix(opts, "ro,") {
		t.Errorf("/data/ro is mounted %q, want read-only", opts)
	}
	if _, errOut, code := m.Exec("touch", "/data/ro/x"); code == 0 || !strings.Contains(errOut, "Read-only") {
		t.Errorf("write to the read-only pmem volume: exit %d, %q", code, errOut)
	}

	// Stats through crustd, measured in the guest.
	st := statsOf(t, d, tRW)
	if st.total <= 0 || st.total > 64*mib || st.used < 4*mib || st.inodes == 0 {
		t.Errorf("stats of the pmem volume: %+v", st)
	}
	// Expansion: UNIMPLEMENTED, nothing changed.
	before := getVolume(t, d, tRW)
	_, errOut, code = d.crustctl("expand", tRW, "--size", strconv.FormatInt(128*mib, 10))
	if code == 0 || !strings.Contains(errOut, "Unimplemented") || !strings.Contains(errOut, "persistent memory") {
		t.Errorf("expand of a pmem volume: exit %d, %q; want UNIMPLEMENTED saying it is persistent memory", code, errOut)
	}
	if after := getVolume(t, d, tRW); after.GetRequestedBytes() != before.GetRequestedBytes() {
		t.Errorf("the refused expansion recorded requested_bytes %d", after.GetRequestedBytes())
	}
	if fi, err := os.Stat(rw); err != nil || fi.Size() != 64*mib {
		t.Errorf("backing file after the refused expansion: %v, %v", fi, err)
	}
	// The Kata caveat, in get and ls -o wide.
	const caveat = "Kata does not attach a file-backed pmem volume"
	if c := before.GetKataCaveats(); len(c) != 1 || !strings.HasPrefix(c[0], caveat) {
		t.Errorf("crustctl get: kata_caveats %q", c)
	}
	if wide, _, _ := d.crustctl("ls", "-o", "wide"); !strings.Contains(wide, "KATA CAVEATS") || !strings.Contains(wide, caveat) {
		t.Errorf("crustctl ls -o wide shows no caveat:\n%s", wide)
	}

	// The blank volume could not be mounted, but its device is in the VM for good: still claimed.
	if got := m.WaitLogValue("volume not attached; trying again when its descriptor changes", "target", "target="+tBlank); got != tBlank {
		t.Errorf("the blank pmem volume's failed mount was not logged")
	}
	// The same claim, held: not released and made again.
	c1 := getVolume(t, d, tBlank).GetClaim()
	time.Sleep(2 * time.Second) // held over time: nothing may happen in it
	c2 := getVolume(t, d, tBlank).GetClaim()
	if c1.GetSandboxId() != name || !proto.Equal(c1, c2) {
		t.Errorf("the blank pmem volume, in the VM though unmounted, is not held by one claim of %s: %v, then %v", name, c1, c2)
	}
	if n := strings.Count(m.Log(), "target="+tBlank+" "); n > 3 {
		t.Errorf("the blank pmem volume was worked on %d times (claimed and released again and again?):\n%s", n, m.Log())
	}

	m.Stop()
	for _, tp := range []string{tRW, tRO, tBlank} {
		if c := getVolume(t, d, tp).GetClaim(); c != nil {
			t.Errorf("%s still claimed after stop: %v", tp, c)
		}
	}
	log := m.Log()
	unmounted := strings.Index(log, "persistent-memory volume unmounted; it stays in the VM, and claimed, until the VM stops")
	released := strings.Index(log, "volume released after the VM stopped")
	if unmounted < 0 || released < unmounted {
		t.Errorf("the pmem volumes were not unmounted first and released after the VM stopped:\n%s", log)
	}

	// The host reads what the guest wrote, from the backing file.
	host, err := exec.Command("debugfs", "-R", "cat /data", rw).Output()
	if err != nil {
		t.Fatalf("debugfs: %v", err)
	}
	sum := md5.Sum(host)
	if got := hex.EncodeToString(sum[:]); got != guestMD5 {
		t.Errorf("the backing file holds /data with md5 %s (%d bytes); the guest wrote %s", got, len(host), guestMD5)
	}
	hostSt := hostStatfsOfImage(t, rw)
	if !near(st.total, hostSt, 4096) {
		t.Errorf("stats total %d, the host's statfs of the same filesystem %d", st.total, hostSt)
	}
}

// hostStatfsOfImage mounts an image file read-only on the host and returns its filesystem's total bytes.
func hostStatfsOfImage(t *testing.T, file string) int64 {
	t.Helper()
	dir := t.TempDir()
	harness.Run(t, "mount", "-o", "ro,loop", file, dir)
	defer harness.Run(t, "umount", dir)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Frsize
}
