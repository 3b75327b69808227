package manager

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestNodeHolds: the node is a holder like any sandbox. With disk1 and disk2 two names of one file:
// a hold of the node's on a device a sandbox claims read-write is FailedPrecondition naming the sandbox
// and its pod; a hold on a free device is recorded (a repeat returns it; another device at its target is
// AlreadyExists; a second hold of the node's on the device is granted: one kernel), after which a deposit
// and a claim of the device, or of its other name, are FailedPrecondition naming the node and the pod it
// mounts for, across a restart too. No descriptor, Kata volume directory or list entry shows a hold. Once
// both holds end, the device is deposited and claimed. Read-only holds share with read-only claims. The
// hold of a pod whose directory is gone is garbage-collected.
func TestNodeHolds(t *testing.T) {
	e := newEnv(t)
	files := map[string]uint64{"disk0": 1, "disk1": 2, "disk2": 2, "disk3": 3}
	e.loopsOver(files)
	ctx := context.Background()
	hold := func(i, disk int, readOnly bool) (*crustv1.NodeHold, error) {
		s := e.spec(i, disk)
		return e.m.HoldForNode(ctx, &crustv1.NodeHold{VolumeTargetPath: s.GetVolumeTargetPath(),
			DevicePath: s.GetVolumeBackingPath(), ReadOnly: readOnly, PodNamespace: "default", PodName: "runc-pod"})
	}
	want := func(what string, err error, kind string, names ...string) {
		t.Helper()
		if code(err) != kind {
			t.Fatalf("%s: %v; want %s", what, err, kind)
		}
		for _, n := range names {
			if !strings.Contains(err.Error(), n) {
				t.Fatalf("%s: %v; want it to name %s", what, err, n)
			}
		}
	}

	sb := e.spec(0, 0)
	sb.Metadata = map[string]string{"csi.storage.k8s.io/pod.namespace": "apps", "csi.storage.k8s.io/pod.name": "vm-pod"}
	e.stage(sb)
	if _, err := e.m.Claim(ctx, e.target(0), "sb1", "unix:///run/crust/handlers/h.sock"); err != nil {
		t.Fatal(err)
	}
	_, err := hold(1, 0, false)
	want("a hold of a device a sandbox claims", err, "failed precondition", `sandbox "sb1"`, "pod apps/vm-pod",
		"unix:///run/crust/handlers/h.sock")

	e.stage(e.spec(5, 1)) // deposited before the hold: a deposit is not a holder
	h, err := hold(2, 1, false)
	if err != nil || h.GetHoldTime() == nil {
		t.Fatalf("a hold of a free device: %v, %v", h, err)
	}
	if again, err := hold(2, 1, false); err != nil || !again.GetHoldTime().AsTime().Equal(h.GetHoldTime().AsTime()) {
		t.Fatalf("a repeated hold: %v, %v; want the hold kept", again, err)
	}
	_, err = hold(2, 3, false)
	want("another device at a held target", err, "already exists")
	if _, err := hold(3, 1, false); err != nil {
		t.Fatalf("a second hold of the node's on the device: %v", err)
	}
	_, err = hold(0, 3, false)
	want("a hold at a target that holds a descriptor", err, "failed precondition")
	refused := func(when string) {
		t.Helper()
		_, err := e.m.Stage(ctx, e.spec(4, 1))
		want("a deposit of a device the node holds "+when, err, "failed precondition", "the node", "pod default/runc-pod")
		_, err = e.m.Stage(ctx, e.spec(4, 2))
		want("a deposit of another name of it "+when, err, "failed precondition", "the node", "pod default/runc-pod")
		_, err = e.m.Claim(ctx, e.target(5), "sb2", "")
		want("a claim of a device the node holds "+when, err, "failed precondition", "the node", "pod default/runc-pod")
		_, err = e.m.Stage(ctx, e.spec(2, 3))
		want("a deposit at the target of a hold "+when, err, "failed precondition", "where the node mounts")
	}
	refused("")
	e.reopen()
	refused("after a restart")
	if holds := e.m.NodeHolds(); len(holds) != 2 || holds[0].GetVolumeTargetPath() > holds[1].GetVolumeTargetPath() {
		t.Fatalf("NodeHolds after a restart: %v; want the two holds, in order", holds)
	}
	if n := len(e.m.List(ctx)); n != 2 {
		t.Fatalf("List has %d volumes; want the two descriptors, no hold", n)
	}
	if _, err := e.m.Get(ctx, e.target(2)); code(err) != "not found" {
		t.Fatalf("Get of a hold's target: %v; want NotFound", err)
	}
	if _, err := os.Stat(e.volDir(e.target(2))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a Kata volume directory for a hold: %v; want none", err)
	}

	for _, i := range []int{2, 3, 2} { // the last a repeat
		if err := e.m.ReleaseFromNode(ctx, e.target(i)); err != nil {
			t.Fatal(err)
		}
	}
	e.stage(e.spec(4, 2))
	if _, err := e.m.Claim(ctx, e.target(4), "sb2", ""); err != nil {
		t.Fatalf("a claim once the node's holds ended: %v", err)
	}
	if holds := e.m.NodeHolds(); len(holds) != 0 {
		t.Fatalf("NodeHolds once released: %v", holds)
	}

	// Read-only shares with read-only.
	ro := e.spec(6, 3)
	ro.ReadOnly = true
	e.stage(ro)
	if _, err := e.m.Claim(ctx, e.target(6), "sb3", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := hold(7, 3, true); err != nil {
		t.Fatalf("a read-only hold beside a read-only claim: %v", err)
	}
	_, err = hold(8, 3, false)
	want("a read-write hold beside a read-only claim", err, "failed precondition", `sandbox "sb3"`)

	// A hold of a pod whose directory kubelet removed (after unmounting its volumes) is collected.
	for _, i := range []int{0, 5, 6} { // the pods of the descriptors exist
		if err := os.MkdirAll(e.target(i), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if gone := e.m.CollectGarbage(ctx); !slices.Equal(gone, []string{e.target(7)}) || len(e.m.NodeHolds()) != 0 {
		t.Fatalf("garbage collection took %v and left holds %v; want the hold of pod-3, which has no directory", gone, e.m.NodeHolds())
	}
}

// TestCheckRawDevice: a device may go raw into a sandbox unless another sandbox holds a filesystem on
// its storage (under any of its names) or the node holds it; raw block volumes of other sandboxes, the
// sandbox's own filesystem, and read-only filesystems for a read-only device are no obstacle. A device
// number with an inode is InvalidArgument.
func TestCheckRawDevice(t *testing.T) {
	e := newEnv(t)
	files := map[string]uint64{"disk0": 1, "disk1": 2, "disk2": 3, "disk3": 1, "disk4": 4}
	e.loopsOver(files)
	ctx := context.Background()
	for disk, s := range map[int]*crustv1.VolumeSpec{0: e.spec(0, 0), 1: e.rawBlockSpec(1, 1), 4: e.spec(4, 4)} {
		if disk == 4 {
			s.ReadOnly = true
		}
		e.stage(s)
		if _, err := e.m.Claim(ctx, s.GetVolumeTargetPath(), "sb1", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.m.HoldForNode(ctx, &crustv1.NodeHold{VolumeTargetPath: e.target(2), DevicePath: e.spec(2, 2).GetVolumeBackingPath()}); err != nil {
		t.Fatal(err)
	}
	number := func(disk int) *crustv1.DeviceNumber {
		var st unix.Stat_t
		if err := unix.Stat(e.spec(0, disk).GetVolumeBackingPath(), &st); err != nil {
			t.Fatal(err)
		}
		return &crustv1.DeviceNumber{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}
	}
	for _, c := range []struct {
		what     string
		sandbox  string
		disk     int
		readOnly bool
		want     string
	}{
		{"another sandbox's filesystem", "sb2", 0, false, `sandbox "sb1"`},
		{"the sandbox's own filesystem", "sb1", 0, false, ""},
		{"another sandbox's raw block volume", "sb2", 1, false, ""},
		{"a device the node holds", "sb2", 2, false, "the node"},
		{"another name of a filesystem's storage", "sb2", 3, false, `sandbox "sb1"`},
		{"a read-only filesystem, read-write", "sb2", 4, false, `sandbox "sb1"`},
		{"a read-only filesystem, read-only", "sb2", 4, true, ""},
	} {
		err := e.m.CheckRawDevice(ctx, c.sandbox, number(c.disk), c.readOnly)
		if c.want == "" && err != nil || c.want != "" && (code(err) != "failed precondition" || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v; want %q", c.what, err, c.want)
		}
	}
	if err := e.m.CheckRawDevice(ctx, "sb2", &crustv1.DeviceNumber{Major: 7, Minor: 1, Inode: 5}, false); code(err) != "invalid argument" {
		t.Errorf("a file's number: %v; want InvalidArgument", err)
	}
}
