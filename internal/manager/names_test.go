package manager

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/hostdev"
)

// TestOtherNamesOfOneDevice: with disk0 and disk1 loop devices over one file and disk2 over another, a
// claim of disk1 while disk0 is claimed through another target is FailedPrecondition naming the holder
// and its target, for another sandbox and for the same one, and across a restart; disk2 is claimed
// meanwhile; once disk0's claim is released, disk1 is claimed. Two read-only targets on two names of one
// file are both claimed.
func TestOtherNamesOfOneDevice(t *testing.T) {
	e := newEnv(t)
	files := map[string]uint64{"disk0": 1, "disk1": 1, "disk2": 2, "disk3": 3, "disk4": 3}
	e.loopsOver(files)
	ctx := context.Background()
	for i := range 3 {
		e.stage(e.spec(i, i))
	}
	if _, err := e.m.Claim(ctx, e.target(0), "sb1", ""); err != nil {
		t.Fatal(err)
	}
	wantRefused := func(what, sandbox string) {
		t.Helper()
		_, err := e.m.Claim(ctx, e.target(1), sandbox, "")
		if code(err) != "failed precondition" || !strings.Contains(err.Error(), `sandbox "sb1"`) ||
			!strings.Contains(err.Error(), e.target(0)) {
			t.Fatalf("%s: %v; want FailedPrecondition naming sandbox sb1 and %s", what, err, e.target(0))
		}
		if v, _ := e.m.Get(ctx, e.target(1)); v.GetClaim() != nil {
			t.Fatalf("%s left a claim: %v", what, v.GetClaim())
		}
	}
	wantRefused("a claim of disk1 by another sandbox while disk0, over the same file, is claimed", "sb2")
	wantRefused("a claim of disk1 by the sandbox that holds disk0", "sb1")
	if _, err := e.m.Claim(ctx, e.target(2), "sb2", ""); err != nil {
		t.Fatalf("a claim of disk2, over another file: %v", err)
	}
	e.reopen()
	wantRefused("after a restart", "sb2")

	if err := e.m.Release(ctx, e.target(0), "sb1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Claim(ctx, e.target(1), "sb2", ""); err != nil {
		t.Fatalf("a claim of disk1 once disk0 is released: %v", err)
	}
	if _, err := e.m.Claim(ctx, e.target(0), "sb1", ""); code(err) != "failed precondition" {
		t.Fatalf("a claim of disk0 while disk1 is claimed: %v; want FailedPrecondition", err)
	}

	for i := 3; i < 5; i++ {
		spec := e.spec(i, i)
		spec.ReadOnly = true
		e.stage(spec)
		if _, err := e.m.Claim(ctx, e.target(i), "sb-ro-"+string(rune('a'+i)), ""); err != nil {
			t.Fatalf("a read-only claim of disk%d: %v", i, err)
		}
	}
}

// loopsOver makes the env's devices loop devices whose backing files are files[name] (an inode on one
// filesystem; two names with one inode are two loop devices over one file), and reopens the manager.
func (e *env) loopsOver(files map[string]uint64) {
	e.devices = hostdev.Sysfs{Root: e.sysfs, Loops: func(bd *hostdev.BlockDevice) (hostdev.LoopBacking, error) {
		return hostdev.LoopBacking{Device: unix.Mkdev(8, 1), Inode: files[bd.Name]}, nil
	}}
	e.reopen()
}
