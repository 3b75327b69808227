package manager

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestClaimOutlivesItsDescriptor: a volume unstaged while sandbox sb1 holds it is gone as a descriptor
// (Get is NotFound, List and the Kata projection do not have it), but the answer returns sb1's claim and
// the device stays reserved for it: a deposit of the device through another target, or of another of
// its names, is FailedPrecondition naming sb1, across a restart too; the target cannot be staged again;
// another sandbox cannot release the claim. Once sb1 releases it the device is claimed; a kept claim
// whose handler is gone is released by ReleaseGone as any other.
func TestClaimOutlivesItsDescriptor(t *testing.T) {
	e := newEnv(t)
	e.loopsOver(map[string]uint64{"disk0": 1, "disk1": 1, "disk2": 2}) // disk1 is another name of disk0's storage
	ctx := context.Background()
	t0, t1 := e.target(0), e.target(1)
	e.stage(e.spec(0, 0))
	if _, err := e.m.Claim(ctx, t0, "sb1", ""); err != nil {
		t.Fatal(err)
	}
	kept, err := e.m.Unstage(ctx, t0)
	if err != nil || kept.GetSandboxId() != "sb1" {
		t.Fatalf("unstage of a claimed volume: kept %v, %v; want sb1's claim", kept, err)
	}
	if _, err := e.m.Get(ctx, t0); code(err) != "not found" {
		t.Fatalf("Get of an unstaged volume whose claim is kept: %v; want NotFound", err)
	}
	if n := len(e.m.List(ctx)); n != 0 {
		t.Fatalf("List has %d volumes after the unstage; want none", n)
	}
	if _, err := os.Stat(e.volDir(t0)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the Kata volume directory of the unstaged volume: %v; want it gone", err)
	}
	wantRefused := func(what string, i, disk int) {
		t.Helper()
		_, err := e.m.Stage(ctx, e.spec(i, disk))
		if code(err) != "failed precondition" || !strings.Contains(err.Error(), `"sb1"`) {
			t.Fatalf("%s: %v; want FailedPrecondition naming sb1", what, err)
		}
	}
	wantRefused("a deposit of the device through another target", 1, 0)
	wantRefused("a deposit of another name of the device", 2, 1)
	e.reopen()
	wantRefused("a deposit of the device after a restart", 1, 0)
	if again, err := e.m.Unstage(ctx, t0); err != nil || again.GetSandboxId() != "sb1" {
		t.Fatalf("a repeated unstage: kept %v, %v; want sb1's claim again", again, err)
	}
	if _, err := e.m.Stage(ctx, e.spec(0, 0)); code(err) != "failed precondition" || !strings.Contains(err.Error(), `"sb1"`) {
		t.Fatalf("staging the target of a kept claim again: %v; want FailedPrecondition naming sb1", err)
	}
	if err := e.m.Release(ctx, t0, "sb2", false); code(err) != "failed precondition" {
		t.Fatalf("another sandbox's release of the kept claim: %v; want FailedPrecondition", err)
	}
	if err := e.m.Release(ctx, t0, "sb1", false); err != nil {
		t.Fatal(err)
	}
	e.stage(e.spec(1, 0))
	if _, err := e.m.Claim(ctx, t1, "sb2", ""); err != nil {
		t.Fatalf("a claim of the device once the kept claim is released: %v", err)
	}
	e.reopen()
	if _, err := e.m.Unstage(ctx, t0); err != nil {
		t.Fatal(err)
	}
	// A kept claim ends with its handler.
	kept, err = e.m.Unstage(ctx, t1)
	if err != nil || kept.GetSandboxId() != "sb2" {
		t.Fatalf("unstage of t1: kept %v, %v; want sb2's claim", kept, err)
	}
	if c := e.m.HandlerClaims()[t1]; c.GetSandboxId() != "sb2" {
		t.Fatalf("HandlerClaims has %v for the kept claim of t1; want sb2's", c)
	}
	if gone, err := e.m.ReleaseGone(ctx, t1, kept, "test"); !gone || err != nil {
		t.Fatalf("ReleaseGone of a kept claim: %v, %v", gone, err)
	}
	e.stage(e.spec(0, 0)) // the kept claims are gone: the target takes a deposit again
	if _, err := e.m.Claim(ctx, t0, "sb3", ""); err != nil {
		t.Fatalf("a claim of the device once its handler is gone: %v", err)
	}
}
