package e2e

import (
	"crypto/md5" //nolint:gosec // a checksum of test data, as md5sum in the guest computes it
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMSharing runs the two ways one sandbox shares a volume, in one crust-microvm VM (TCG):
//
//   - two containers of the pod using one volume: one target given at two guest paths is claimed once,
//     attached as one disk and mounted at both; a file written at one path is read at the other; stats
//     and an online expansion answer for the volume, seen at both paths; stop unmounts both before the
//     disk goes, and the data is on the device;
//   - two read-only targets staged on one device: both are claimed and attached (QEMU opens the device
//     twice, read-only), mounted, and show the device's data; a read-write third target on that device is
//     refused by crustd, for this sandbox and for another, with a message that says why.
func TestMicroVMSharing(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	stateDir := t.TempDir()
	const name = "e2e-share"
	pod := "3c9e0f1a-0000-4000-8000-00000000e2e6"

	shared, sharedDev := d.podTarget(pod, "pvc-shared"), loopDevice(t, 64*mib)
	ro1, ro2, rw3 := d.podTarget(pod, "pvc-ro-1"), d.podTarget(pod, "pvc-ro-2"), d.podTarget(pod, "pvc-rw-3")
	roDev := loopDevice(t, 32*mib)
	mkfsHello(t, roDev)
	for _, args := range [][]string{
		{"--target-path", shared, "--device", sharedDev, "--fs-type", "ext4", "--create-filesystem"},
		{"--target-path", ro1, "--device", roDev, "--fs-type", "ext4", "--read-only"},
		{"--target-path", ro2, "--device", roDev, "--fs-type", "ext4", "--read-only"},
		{"--target-path", rw3, "--device", roDev, "--fs-type", "ext4"},
	} {
		d.crustctlOK(append([]string{"stage"}, args...)...)
	}

	m := startMicroVM(t, d, assets, stateDir, name,
		shared+":/c1/data", shared+":/c2/data", ro1+":/c1/ro", ro2+":/c2/ro")
	for _, p := range []string{"/c1/data", "/c2/data", "/c1/ro", "/c2/ro"} {
		if err := <-m.WaitMountedAsync(p); err != nil {
			t.Fatal(err)
		}
	}
	source := func(p string) string {
		return m.ExecOK("awk", fmt.Sprintf("$2 == %q {print $1}", p), "/proc/mounts")
	}

	// One volume at two guest paths: one claim, one disk, one filesystem.
	if c := getVolume(t, d, shared).GetClaim(); c.GetSandboxId() != name {
		t.Errorf("%s is claimed by %v, want sandbox %s", shared, c, name)
	}
	if a, b := source("/c1/data"), source("/c2/data"); a == "" || a != b {
		t.Errorf("/c1/data is a mount of %q, /c2/data of %q: want one disk", a, b)
	}
	if got := m.WaitLogValue("volume mounted", "also_at", "target="+shared); got != "/c2/data" {
		t.Errorf("the handler's log says the shared volume is also at %q, want /c2/data", got)
	}
	if n := strings.Count(m.ExecOK("ls", "/sys/block"), "vd"); n != 3 {
		t.Errorf("the guest has %d virtio disks, want 3 (the shared volume once, the read-only device twice)", n)
	}
	sum := strings.Fields(m.ExecOK("sh", "-c", "dd if=/dev/urandom of=/c1/data/f bs=1M count=4 2>/dev/null && sync && md5sum /c1/data/f"))[0]
	if got := strings.Fields(m.ExecOK("md5sum", "/c2/data/f"))[0]; got != sum {
		t.Errorf("written at /c1/data with md5 %s, read at /c2/data as %s", sum, got)
	}
	before := statsOf(t, d, shared)
	if before.used < 4*mib {
		t.Errorf("stats of the shared volume: %+v, want the 4 MiB written", before)
	}
	after := expandTo(t, d, shared, sharedDev, 128*mib)
	for _, p := range []string{"/c1/data", "/c2/data"} {
		total, err := strconv.ParseInt(m.ExecOK("sh", "-c", "stat -f -c '%b %S' "+p+" | awk '{print $1 * $2}'"), 10, 64)
		if err != nil || total != after.total || after.total < 2*before.total-8*mib {
			t.Errorf("%s after the expansion: %d bytes (%v); stats %d, before %d", p, total, err, after.total, before.total)
		}
	}

	// Two read-only targets of one device: two disks, both mounted, the same data, no writes.
	if a, b := source("/c1/ro"), source("/c2/ro"); a == "" || b == "" || a == b {
		t.Errorf("/c1/ro is a mount of %q, /c2/ro of %q: want two disks", a, b)
	}
	for _, p := range []string{"/c1/ro", "/c2/ro"} {
		if got := m.ExecOK("cat", p+"/hello"); got != "from the host" {
			t.Errorf("%s/hello = %q", p, got)
		}
		if _, errOut, code := m.Exec("touch", p+"/x"); code == 0 || !strings.Contains(errOut, "Read-only") {
			t.Errorf("write to %s: exit %d, stderr %q", p, code, errOut)
		}
	}
	for _, target := range []string{ro1, ro2} {
		if c := getVolume(t, d, target).GetClaim(); c.GetSandboxId() != name {
			t.Errorf("%s is claimed by %v, want sandbox %s", target, c, name)
		}
	}
	// A read-write target of the same device is refused, whoever asks.
	for _, sb := range []string{name, "another-sandbox"} {
		_, errOut, code := d.crustctl("claim", rw3, "--sandbox-id", sb)
		if code != 1 || !strings.Contains(errOut, "FailedPrecondition") || !strings.Contains(errOut, "read-only") ||
			!strings.Contains(errOut, ro1) && !strings.Contains(errOut, ro2) {
			t.Errorf("claim of a read-write target of the shared read-only device by %s: exit %d: %s", sb, code, errOut)
		}
	}

	m.Stop()
	for _, target := range []string{shared, ro1, ro2, rw3} {
		if c := getVolume(t, d, target).GetClaim(); c != nil {
			t.Errorf("%s still claimed after stop: %v", target, c)
		}
	}
	if got := m.LogValue("volume unmounted, detached and released", "target", "target="+shared); got != shared {
		t.Errorf("the shared volume was not unmounted and detached cleanly:\n%s", m.Log())
	}
	dir := t.TempDir()
	harness.Run(t, "mount", "-o", "ro", sharedDev, dir)
	defer harness.Run(t, "umount", dir)
	out, err := os.ReadFile(filepath.Join(dir, "f"))
	if got := fmt.Sprintf("%x", md5.Sum(out)); err != nil || got != sum {
		t.Errorf("the file written in the guest, on the host: md5 %s (%v), the guest wrote %s", got, err, sum)
	}
}
