package e2e

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMGrowsAtMount expands volumes before any sandbox claims them, as kubelet does for a pod that
// has not started yet: the backing files grow, crustctl expand makes the loop devices see it and records
// the size; then crust-microvm claims them and the guest finds filesystems grown to the disks, with
// their data. One VM boot (TCG), an ext4 and an xfs volume.
func TestMicroVMGrowsAtMount(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	type vol struct {
		target, guest, dev, fsType string
		size                       int64
	}
	const uid = "3c9e0f1a-0000-4000-8000-00000000e2e7"
	vols := []vol{
		{target: d.podTarget(uid, "pvc-ext4"), guest: "/data/ext4", fsType: "ext4", size: 64 * mib},
		{target: d.podTarget(uid, "pvc-xfs"), guest: "/data/xfs", fsType: "xfs", size: 320 * mib},
	}
	var volumes []string
	for i := range vols {
		v := &vols[i]
		v.dev = loopDevice(t, v.size)
		if v.fsType == "ext4" {
			mkfsHello(t, v.dev)
		} else {
			harness.Run(t, "mkfs.xfs", "-q", "-f", v.dev)
		}
		d.crustctlOK("stage", "--target-path", v.target, "--device", v.dev, "--fs-type", v.fsType)
		// The controller grows the backing volume; the node expansion comes before any sandbox.
		if err := os.Truncate(backingFile(t, v.dev), 2*v.size); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := d.crustctl("expand", v.target, "--size", strconv.FormatInt(2*v.size, 10), "-o", "json")
		var r crustv1.ExpandVolumeResponse
		if code != 0 || protojson.Unmarshal([]byte(out), &r) != nil || r.GetCapacityBytes() != 2*v.size {
			t.Fatalf("expand %s before a claim: exit %d: %s%s; want capacity %d", v.fsType, code, out, errOut, 2*v.size)
		}
		if got := getVolume(t, d, v.target).GetRequestedBytes(); got != 2*v.size {
			t.Fatalf("%s: requested_bytes %d, want %d", v.fsType, got, 2*v.size)
		}
		if u := statsOf(t, d, v.target); u.total != 2*v.size || u.used != 0 {
			t.Fatalf("%s: stats before a claim %+v, want the device's %d bytes, usage unknown", v.fsType, u, 2*v.size)
		}
		volumes = append(volumes, v.target+":"+v.guest)
	}

	m := startMicroVM(t, d, assets, t.TempDir(), "e2e-grow-at-mount", volumes...)
	for _, v := range vols {
		if err := <-m.WaitMountedAsync(v.guest); err != nil {
			t.Fatalf("%s: %v", v.guest, err)
		}
		grewFrom := m.WaitLogValue("volume mounted", "grew_from_bytes", "target="+v.target)
		devSize := m.ExecOK("sh", "-c", fmt.Sprintf("blockdev --getsize64 $(awk '$2 == %q {print $1}' /proc/mounts)", v.guest))
		fsBytes := m.ExecOK("sh", "-c", fmt.Sprintf("df -B1 %s | awk 'NR == 2 {print $2}'", v.guest))
		total, _ := strconv.ParseInt(fsBytes, 10, 64)
		u := statsOf(t, d, v.target)
		t.Logf("%s: disk %s bytes in the guest, filesystem grown at mount from %s to %d bytes (df), stats total %d",
			v.fsType, devSize, grewFrom, total, u.total)
		if devSize != strconv.FormatInt(2*v.size, 10) {
			t.Errorf("%s: the guest's disk is %s bytes, want %d", v.fsType, devSize, 2*v.size)
		}
		if grewFrom != strconv.FormatInt(v.size, 10) {
			t.Errorf("%s: the handler logged grew_from_bytes=%q, want %d", v.fsType, grewFrom, v.size)
		}
		// Metadata takes its share; a filesystem still at the old size would be under v.size.
		if total <= v.size || total > 2*v.size || u.total != total {
			t.Errorf("%s: filesystem %d bytes in the guest, stats %d, for a disk of %d grown from %d", v.fsType, total, u.total, 2*v.size, v.size)
		}
	}
	if got := m.ExecOK("cat", vols[0].guest+"/hello"); got != "from the host" {
		t.Errorf("data on the grown ext4: %q", got)
	}
	// A second mount of a filesystem that already fills its disk grows nothing.
	m.Stop()
	m = startMicroVM(t, d, assets, t.TempDir(), "e2e-grow-at-mount-2", volumes...)
	for _, v := range vols {
		if err := <-m.WaitMountedAsync(v.guest); err != nil {
			t.Fatalf("%s, again: %v", v.guest, err)
		}
		if m.WaitLogValue("volume mounted", "target", "target="+v.target) == "" {
			t.Fatalf("%s: no mount logged on the second run", v.fsType)
		}
		if g := m.LogValue("volume mounted", "grew_from_bytes", "target="+v.target); g != "" {
			t.Errorf("%s: grown again (from %s) on a second mount", v.fsType, g)
		}
	}
	m.Stop()
}
