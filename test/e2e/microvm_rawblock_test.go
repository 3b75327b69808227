package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMRawBlock: raw block volumes (volume_mode VOLUME_MODE_BLOCK) through the real crustd,
// crustctl and crust-microvm with a TCG guest, on loop devices. One VM boot.
//
// It checks: crustctl stages them (--volume-mode block) and refuses a filesystem field for them, naming
// it; get and ls -o wide show the mode and the Kata caveat, and nothing is written into the Kata
// directory; in the guest each volume is a block device node at its guest path, with the hot-plugged
// disk's numbers, and nothing is mounted there; a pattern written with dd through the guest path is on
// the host's loop device, and one written on the host is read in the guest; the read-only volume refuses
// writes and keeps its data; stats are one bytes entry whose total is the device's size; an expansion
// grows the disk the guest sees (block_resize) and answers its size, data intact; stop releases both.
func TestMicroVMRawBlock(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	const name = "e2e-rawblock"
	pod := "3c9e0f1a-0000-4000-8000-00000000e2eb"
	rw := struct{ target, guest, dev string }{d.podTarget(pod, "pvc-raw"), "/dev/xvda", loopDevice(t, 64*mib)}
	ro := struct{ target, guest, dev string }{d.podTarget(pod, "pvc-raw-ro"), "/data/raw-ro", loopDevice(t, 16*mib)}

	// A pattern written on the host, to be read in the guest through the read-only volume.
	hostPattern := filepath.Join(t.TempDir(), "host-pattern")
	harness.Run(t, "dd", "if=/dev/urandom", "of="+hostPattern, "bs=4096", "count=64", "status=none")
	harness.Run(t, "dd", "if="+hostPattern, "of="+ro.dev, "bs=4096", "seek=7", "conv=fsync", "status=none")
	hostSum := md5Of(t, hostPattern)

	// A filesystem field on a raw block volume is refused, naming it.
	if _, errOut, code := d.crustctl("stage", "--target-path", rw.target, "--device", rw.dev, "--volume-mode", "block",
		"--fs-type", "ext4"); code == 0 || !strings.Contains(errOut, "InvalidArgument") || !strings.Contains(errOut, "spec.fs_type") {
		t.Fatalf("raw block with an fs type: exit %d, %q; want InvalidArgument naming spec.fs_type", code, errOut)
	}
	for _, args := range [][]string{
		{"--target-path", rw.target, "--device", rw.dev, "--volume-mode", "block"},
		{"--target-path", ro.target, "--device", ro.dev, "--volume-mode", "block", "--read-only"},
	} {
		d.crustctlOK(append([]string{"stage"}, args...)...)
	}
	if v := getVolume(t, d, rw.target); v.GetSpec().GetVolumeMode() != crustv1.VolumeMode_VOLUME_MODE_BLOCK ||
		len(v.GetKataCaveats()) != 1 || !strings.Contains(v.GetKataCaveats()[0], "not projected") {
		t.Fatalf("crustctl get: mode %v, caveats %q", v.GetSpec().GetVolumeMode(), v.GetKataCaveats())
	}
	wide := d.crustctlOK("ls", "-o", "wide")
	for _, target := range []string{rw.target, ro.target} {
		if f := fieldsOfLine(wide, target); !slices.Contains(f, "block") || !strings.Contains(strings.Join(f, " "), "not projected") {
			t.Errorf("ls -o wide does not show %s as block with its caveat:\n%s", target, wide)
		}
	}
	if entries, err := os.ReadDir(d.kata); err != nil {
		t.Fatal(err)
	} else {
		for _, e := range entries {
			if e.Name() != ".crust-tmp" {
				t.Errorf("the Kata directory holds %s for a raw block volume", e.Name())
			}
		}
	}

	m := startMicroVM(t, d, assets, t.TempDir(), name, rw.target+":"+rw.guest, ro.target+":"+ro.guest)
	for _, v := range []struct{ target, guest string }{{rw.target, rw.guest}, {ro.target, ro.guest}} {
		if got := m.WaitLogValue("volume mounted", "raw_block", "target="+v.target); got != "true" {
			t.Fatalf("%s: raw_block=%q in the handler's log", v.target, got)
		}
		// The node at the guest path is the hot-plugged disk's: same numbers as the /dev/vdX it came as.
		out := m.ExecOK("sh", "-c", fmt.Sprintf(`stat -c '%%F %%t:%%T' %[1]s; for d in /sys/block/vd*; do `+
			`[ "$(cat $d/dev)" = "$(printf '%%d:%%d' 0x$(stat -c %%t %[1]s) 0x$(stat -c %%T %[1]s))" ] && basename $d; done; `+
			`awk '$2 == %[1]q' /proc/mounts | wc -l`, v.guest))
		f := strings.Fields(strings.ReplaceAll(out, "block special file", "block-special"))
		if len(f) != 4 || f[0] != "block-special" || !strings.HasPrefix(f[2], "vd") || f[3] != "0" {
			t.Fatalf("%s in the guest: %q; want a block device node of a vd disk, nothing mounted", v.guest, out)
		}
	}

	// Guest to host: dd through the guest path, read on the host from the loop device.
	out := m.ExecOK("sh", "-c", "dd if=/dev/urandom of=/tmp/p bs=4096 count=256 2>/dev/null && "+
		"dd if=/tmp/p of="+rw.guest+" bs=4096 seek=100 conv=fsync 2>/dev/null && md5sum /tmp/p")
	guestSum := strings.Fields(out)[0]
	onHost := filepath.Join(t.TempDir(), "read-back")
	harness.Run(t, "dd", "if="+rw.dev, "of="+onHost, "bs=4096", "skip=100", "count=256", "iflag=direct", "status=none")
	if got := md5Of(t, onHost); got != guestSum {
		t.Fatalf("the host reads %s from the loop device where the guest wrote %s", got, guestSum)
	}
	// Host to guest, through the read-only volume.
	if got := strings.Fields(m.ExecOK("sh", "-c", "dd if="+ro.guest+" bs=4096 skip=7 count=64 2>/dev/null | md5sum"))[0]; got != hostSum {
		t.Fatalf("the guest reads %s where the host wrote %s", got, hostSum)
	}
	// Read-only: writes are refused, the data stays.
	if _, errOut, code := m.Exec("dd", "if=/dev/zero", "of="+ro.guest, "bs=4096", "seek=7", "count=1", "conv=fsync"); code == 0 || !strings.Contains(errOut, "error writing") {
		t.Fatalf("a write to the read-only raw volume: exit %d, %q; want a refused write", code, errOut)
	} else {
		t.Logf("write to the read-only raw volume refused: %s", strings.TrimSpace(errOut))
	}
	check := filepath.Join(t.TempDir(), "ro-check")
	harness.Run(t, "dd", "if="+ro.dev, "of="+check, "bs=4096", "skip=7", "count=64", "iflag=direct", "status=none")
	if got := md5Of(t, check); got != hostSum {
		t.Fatalf("the read-only volume's data changed: %s, want %s", got, hostSum)
	}

	// Stats: one bytes entry, the device's size; nothing used or available on a raw device.
	wantStats := func(size int64) {
		t.Helper()
		out := d.crustctlOK("stats", rw.target, "-o", "json")
		var r crustv1.GetVolumeStatsResponse
		if err := protojson.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		if u := r.GetUsage(); len(u) != 1 || u[0].GetUnit() != crustv1.VolumeUsage_UNIT_BYTES || u[0].GetTotal() != size ||
			u[0].GetUsed() != 0 || u[0].GetAvailable() != 0 || r.GetVolumeCondition().GetAbnormal() {
			t.Fatalf("stats: %s; want one bytes entry of total %d", out, size)
		}
	}
	wantStats(64 * mib)

	// Expansion: the backing file grows, crustctl expand makes QEMU resize the disk; the guest sees it.
	if err := os.Truncate(backingFile(t, rw.dev), 128*mib); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	out, errOut, code := d.crustctl("expand", rw.target, "--size", strconv.FormatInt(128*mib, 10), "-o", "json")
	if code != 0 {
		t.Fatalf("expand: exit %d: %s", code, errOut)
	}
	var r crustv1.ExpandVolumeResponse
	if err := protojson.Unmarshal([]byte(out), &r); err != nil || r.GetCapacityBytes() != 128*mib {
		t.Fatalf("expand answered %s (%v); want capacity %d", out, err, 128*mib)
	}
	t.Logf("raw block 64 -> 128 MiB online (crustctl expand, end to end): %s", time.Since(t0).Round(time.Millisecond))
	if got := m.ExecOK("blockdev", "--getsize64", rw.guest); got != strconv.FormatInt(128*mib, 10) {
		t.Errorf("the guest's disk is %s bytes after the expansion, want %d", got, 128*mib)
	}
	wantStats(128 * mib)
	if got := strings.Fields(m.ExecOK("sh", "-c", "dd if="+rw.guest+" bs=4096 skip=100 count=256 2>/dev/null | md5sum"))[0]; got != guestSum {
		t.Errorf("the data changed across the expansion")
	}
	if _, errOut, code := d.crustctl("expand", ro.target, "--size", strconv.FormatInt(16*mib, 10)); code == 0 ||
		!strings.Contains(errOut, "FailedPrecondition") {
		t.Errorf("expand of the read-only raw volume: exit %d, %q; want FailedPrecondition", code, errOut)
	}

	m.Stop()
	for _, target := range []string{rw.target, ro.target} {
		if c := getVolume(t, d, target).GetClaim(); c != nil {
			t.Errorf("%s still claimed after stop: %v", target, c)
		}
	}
	if !strings.Contains(m.Log(), "volume unmounted, detached and released") {
		t.Errorf("the handler did not report detaching:\n%s", m.Log())
	}
}

// fieldsOfLine is the fields of the first line of out that begins with first.
func fieldsOfLine(out, first string) []string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == first {
			return f
		}
	}
	return nil
}

func md5Of(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("md5sum", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))[0]
}
