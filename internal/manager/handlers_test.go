package manager

import (
	"context"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestReleaseGone checks the manager's side of ending a dead handler's claim: the claim names the
// claiming process and its start time (kept across a restart); ReleaseGone ends only the very claim it is
// given, so a handler that claimed again meanwhile keeps its new claim; and every release tells watchers
// who ended the claim and which claim it was.
func TestReleaseGone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tp := e.target(0)
	e.stage(e.spec(0, 0))
	w := e.m.Watch(false)
	defer w.Stop()
	released := func() *crustv1.WatchVolumesResponse {
		t.Helper()
		for ev := range w.Events() {
			if ev.GetType() == crustv1.EventType_EVENT_TYPE_RELEASED {
				return ev
			}
		}
		t.Fatal("watch ended")
		return nil
	}

	first, err := e.m.Claim(WithClaimer(ctx, int32(os.Getpid())), tp, "sb1", "unix:///run/h1.sock")
	if err != nil {
		t.Fatal(err)
	}
	if c := first.GetClaim(); c.GetClaimerPid() != int32(os.Getpid()) || c.GetClaimerStartTime() == 0 {
		t.Fatalf("claim does not name the claiming process: %v", c)
	}
	e.reopen()
	w.Stop()
	w = e.m.Watch(false)
	if c, _ := e.m.Get(ctx, tp); !proto.Equal(c.GetClaim(), first.GetClaim()) {
		t.Fatalf("claim after a restart %v, want %v", c.GetClaim(), first.GetClaim())
	}
	// The same handler claims again from a new process (restarted in place): a new claim.
	second, err := e.m.Claim(ctx, tp, "sb1", "unix:///run/h1.sock")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := e.m.ReleaseGone(ctx, tp, first.GetClaim(), "test"); ok || err != nil {
		t.Fatalf("ReleaseGone of a superseded claim: %t, %v", ok, err)
	}
	if v, _ := e.m.Get(ctx, tp); v.GetClaim() == nil {
		t.Fatal("ReleaseGone of a superseded claim ended the new one")
	}
	if ok, err := e.m.ReleaseGone(ctx, tp, second.GetClaim(), "endpoint refused for 30s"); !ok || err != nil {
		t.Fatalf("ReleaseGone: %t, %v", ok, err)
	}
	ev := released()
	if ev.GetReleaseReason() != crustv1.ReleaseReason_RELEASE_REASON_HANDLER_GONE || !proto.Equal(ev.GetReleasedClaim(), second.GetClaim()) ||
		ev.GetDetail() != "endpoint refused for 30s" || ev.GetVolume().GetClaim() != nil {
		t.Errorf("event %v", ev)
	}
	e.reopen()
	if v, _ := e.m.Get(ctx, tp); v.GetClaim() != nil {
		t.Errorf("the release was not made durable: %v", v.GetClaim())
	}
	w.Stop()
	w = e.m.Watch(false)

	// Releases by the sandbox and forced ones say so too.
	for _, c := range []struct {
		sandbox string
		force   bool
		want    crustv1.ReleaseReason
	}{{"sb1", false, crustv1.ReleaseReason_RELEASE_REASON_SANDBOX}, {"", true, crustv1.ReleaseReason_RELEASE_REASON_FORCED}} {
		if _, err := e.m.Claim(ctx, tp, "sb1", ""); err != nil {
			t.Fatal(err)
		}
		if err := e.m.Release(ctx, tp, c.sandbox, c.force); err != nil {
			t.Fatal(err)
		}
		if ev := released(); ev.GetReleaseReason() != c.want || ev.GetReleasedClaim().GetSandboxId() != "sb1" {
			t.Errorf("release by %q force %t: reason %s, claim %v", c.sandbox, c.force, ev.GetReleaseReason(), ev.GetReleasedClaim())
		}
	}
}
