package vm

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/internal/testutil/harness"
)

// The QMP arguments name the disk's device and its own group, and give QEMU every rate (zero: none).
func TestThrottleArgs(t *testing.T) {
	got := throttleArgs("vol-1", IOLimits{TotalIOPS: 50, WriteBytesPerSecond: 1 << 20, ReadBytesPerSecond: 7})
	want := map[string]any{"id": "/machine/peripheral/crust-disk-vol-1/virtio-backend", "group": "crust-tg-vol-1", "iops": int64(50), "iops_rd": int64(0),
		"iops_wr": int64(0), "bps": int64(0), "bps_rd": int64(7), "bps_wr": int64(1 << 20)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("throttleArgs = %v\nwant %v", got, want)
	}
	if (IOLimits{}).throttled() || !(IOLimits{ReadIOPS: 1}).throttled() {
		t.Error("throttled: only all-zero limits are no throttling")
	}
}

// blockInfo is what query-block says of a disk's throttling.
type blockInfo struct {
	QDev     string `json:"qdev"`
	Inserted *struct {
		IOPS   int64  `json:"iops"`
		IOPSRd int64  `json:"iops_rd"`
		IOPSWr int64  `json:"iops_wr"`
		BPS    int64  `json:"bps"`
		BPSRd  int64  `json:"bps_rd"`
		BPSWr  int64  `json:"bps_wr"`
		Group  string `json:"group"`
	} `json:"inserted"`
}

func queryBlock(t *testing.T, v *VM, id string) *blockInfo {
	t.Helper()
	var all []blockInfo
	if err := v.qmp.Execute(context.Background(), "query-block", nil, &all); err != nil {
		t.Fatal(err)
	}
	for i := range all {
		if strings.Contains(all[i].QDev, diskPrefix+id) {
			return &all[i]
		}
	}
	return nil
}

// TestIOLimits attaches disks with and without limits to a TCG guest: QEMU reports the limits on the
// limited disk and none on the other; attaching again with the same limits is a no-op and with others
// fails; limits QEMU refuses fail the attach and leave nothing of the disk; and a discard of the whole
// limited disk is not charged to its write limit (the reason for the device's own throttling over a
// throttle node).
func TestIOLimits(t *testing.T) {
	ctx, v := tcgGuest(t, 3*time.Minute)
	limited, plain := loopDevice(t, 256*mib), loopDevice(t, 16*mib)
	harness.Run(t, "dd", "if=/dev/urandom", "of="+limited.path, "bs=1M", "count=8", "oflag=direct", "status=none") // for the discard to free
	lim := IOLimits{TotalIOPS: 50, WriteBytesPerSecond: mib}

	if err := v.AttachBlock(ctx, "vol-lim", limited.path, false, WithIOLimits(lim)); err != nil {
		t.Fatal(err)
	}
	if err := v.AttachBlock(ctx, "vol-plain", plain.path, false, WithIOLimits(IOLimits{})); err != nil {
		t.Fatal(err)
	}
	if b := queryBlock(t, v, "vol-lim"); b == nil || b.Inserted == nil || b.Inserted.IOPS != 50 || b.Inserted.BPSWr != mib ||
		b.Inserted.BPS != 0 || b.Inserted.IOPSRd != 0 || b.Inserted.Group != "crust-tg-vol-lim" {
		t.Errorf("query-block of the limited disk: %+v", b)
	}
	if b := queryBlock(t, v, "vol-plain"); b == nil || b.Inserted == nil || b.Inserted.IOPS != 0 || b.Inserted.BPSWr != 0 || b.Inserted.Group != "" {
		t.Errorf("query-block of the disk without limits: %+v", b)
	}
	if err := v.AttachBlock(ctx, "vol-lim", limited.path, false, WithIOLimits(lim)); err != nil {
		t.Errorf("attach again with the same limits: %v", err)
	}
	if err := v.AttachBlock(ctx, "vol-lim", limited.path, false, WithIOLimits(IOLimits{TotalIOPS: 60})); err == nil {
		t.Error("attach again with other limits succeeded")
	}

	// Limits QEMU refuses: the attach fails, and the disk is gone from the VM.
	bad := loopDevice(t, 16*mib)
	err := v.AttachBlock(ctx, "vol-bad", bad.path, false, WithIOLimits(IOLimits{TotalIOPS: 10, ReadIOPS: 5}))
	if err == nil || !strings.Contains(err.Error(), "limiting the I/O of vol-bad") {
		t.Fatalf("attach with total and read IOPS: %v, want QEMU's refusal", err)
	}
	if b := queryBlock(t, v, "vol-bad"); b != nil {
		t.Errorf("the refused disk is still in the VM: %+v", b)
	}
	v.mu.Lock()
	_, held := v.disks["vol-bad"]
	v.mu.Unlock()
	if held {
		t.Error("the refused disk is still recorded")
	}

	// A discard of the whole 256 MiB disk, which a throttle node would charge at 1 MiB/s (over four
	// minutes), takes the time of a discard.
	// The guest waits until its kernel has probed the hot-plugged disk (the exec's timeout bounds it).
	dev := execOK(t, v, "sh", "-c", `while :; do for d in /sys/block/vd*; do `+
		`if [ "$(cat $d/serial 2>/dev/null)" = vol-lim ]; then echo /dev/${d##*/}; exit 0; fi; done; sleep 0.05; done`)
	if dev == "" {
		t.Fatal("the guest has no disk with serial vol-lim")
	}
	out := execOK(t, v, "sh", "-c", fmt.Sprintf("a=$(cut -d' ' -f1 /proc/uptime); blkdiscard %s || exit 1; b=$(cut -d' ' -f1 /proc/uptime); echo $a $b", dev))
	f := strings.Fields(out)
	a, _ := strconv.ParseFloat(f[0], 64)
	b, _ := strconv.ParseFloat(f[len(f)-1], 64)
	t.Logf("blkdiscard of the 256 MiB disk limited to 1 MiB/s of writes: %.2f s in the guest", b-a)
	if b-a > 30 {
		t.Errorf("the discard took %.2f s: it was charged to the write limit", b-a)
	}
	if blocks := harness.Run(t, "stat", "-c", "%b", limited.file); blocks != "0" {
		t.Errorf("the backing file still holds %s blocks: the discard did not reach the host", blocks)
	}
	for _, id := range []string{"vol-lim", "vol-plain"} {
		if err := v.DetachBlock(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
