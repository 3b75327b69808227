package vm

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// TestRawBlockInGuest boots one TCG guest and takes a raw block volume through the agent: exposed as a
// device node of the hot-plugged disk at the target (nothing mounted), again (already there), refused
// over something else or with filesystem arguments, measured (the disk's size), grown (the size QEMU's
// resize shows), and removed by unmount before the disk is unplugged.
func TestRawBlockInGuest(t *testing.T) {
	ctx, v := tcgGuest(t, 5*time.Minute)
	agent := v.Agent()
	dev := loopDevice(t, 32*mib)
	if err := v.AttachBlock(ctx, "vol-raw", dev.path, false); err != nil {
		t.Fatal(err)
	}
	const target = "/dev/xvdb"
	raw := &agentv1.MountRequest{Serial: "vol-raw", Target: target, Block: true}
	res, err := agent.Mount(ctx, raw)
	if err != nil || res.Already {
		t.Fatalf("expose: %+v, %v", res, err)
	}
	want := execOK(t, v, "cat", "/sys/block/"+res.Device[len("/dev/"):]+"/dev")
	if got := execOK(t, v, "sh", "-c", `printf '%d:%d' 0x$(stat -c %t `+target+`) 0x$(stat -c %T `+target+`)`); got != want {
		t.Fatalf("%s is %s, the disk %s is %s", target, got, res.Device, want)
	}
	if got := execOK(t, v, "stat", "-c", "%F", target); got != "block special file" {
		t.Fatalf("%s is a %s", target, got)
	}
	if n := execOK(t, v, "sh", "-c", "awk '$2 == \""+target+"\"' /proc/mounts | wc -l"); n != "0" {
		t.Fatalf("something is mounted on %s", target)
	}
	if res, err := agent.Mount(ctx, raw); err != nil || !res.Already {
		t.Fatalf("expose again: %+v, %v; want already", res, err)
	}

	wantCode := func(what string, err error, kind error) {
		t.Helper()
		if !errors.Is(err, kind) {
			t.Fatalf("%s: %v, want %v", what, err, kind)
		}
	}
	execOK(t, v, "touch", "/tmp/file")
	_, err = agent.Mount(ctx, &agentv1.MountRequest{Serial: "vol-raw", Target: "/tmp/file", Block: true})
	wantCode("expose over a file", err, errdefs.ErrFailedPrecondition)
	_, err = agent.Mount(ctx, &agentv1.MountRequest{Serial: "vol-raw", Target: "/dev/xvdc", Block: true, FsType: "ext4"})
	wantCode("expose with an fs type", err, errdefs.ErrInvalidArgument)

	st, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: target})
	if err != nil || st.GetBytes().GetTotal() != 32*mib || st.GetBytes().GetUsed() != 0 || st.GetInodes().GetTotal() != 0 || st.GetAbnormal() {
		t.Fatalf("statfs = %+v, %v; want a total of %d bytes", st, err, 32*mib)
	}
	dev.growInVM(ctx, t, v, "vol-raw", 48*mib)
	g, err := agent.Grow(ctx, &agentv1.GrowRequest{Target: target, MinDeviceBytes: 48 * mib})
	if err != nil || g.CapacityBytes != 48*mib || g.DeviceBytes != 48*mib {
		t.Fatalf("grow = %+v, %v; want %d", g, err, 48*mib)
	}
	if got := execOK(t, v, "blockdev", "--getsize64", target); got != strconv.Itoa(48*mib) {
		t.Fatalf("the node shows %s bytes after the resize", got)
	}

	// Unmount removes the node (and again is no error); then the disk may go.
	for i := range 2 {
		if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: target}); err != nil {
			t.Fatalf("unmount %d: %v", i, err)
		}
	}
	if out := execOK(t, v, "sh", "-c", fmt.Sprintf("test -e %s && echo there || echo gone", target)); out != "gone" {
		t.Fatalf("%s after unmount: %s", target, out)
	}
	if err := v.DetachBlock(ctx, "vol-raw"); err != nil {
		t.Fatal(err)
	}
}
