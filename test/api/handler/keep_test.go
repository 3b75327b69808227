package handler_test

import (
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/handler"
)

// TestKeepClaimsResumesAcrossARestart: KeepClaims' watch, broken by a clean restart of crustd, resumes
// after the last revision it saw, so a release made before it watches again is seen as that release (its
// reason, where a new listing would show only an unclaimed volume) and the volume is claimed again.
func TestKeepClaimsResumesAcrossARestart(t *testing.T) {
	d := startOwn(t)
	target, driver, err := depositAt(d.dir, d.cfg.Socket, "pv-keep")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = driver.Close() }()
	ctx, c := session(t, d.cfg.Socket)
	if _, err := c.Claim(ctx, target, "sandbox-k", ""); err != nil {
		t.Fatal(err)
	}
	reclaims := make(chan handler.Reclaim, 4)
	go func() {
		_ = c.KeepClaims(ctx, "sandbox-k", "", func(tp string) bool { return tp == target }, func(r handler.Reclaim) { reclaims <- r })
	}()
	conn, err := crustd.Dial(d.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	release := func() {
		t.Helper()
		if _, err := crustv1.NewRuntimeServiceClient(conn).ReleaseVolume(ctx,
			&crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, Force: true}); err != nil {
			t.Fatal(err)
		}
	}
	// Until KeepClaims watches, it does not see a release: release, and claim again, until it does.
	for deadline := time.Now().Add(10 * time.Second); ; {
		release()
		select {
		case <-reclaims:
		case <-time.After(500 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("KeepClaims does not watch")
			}
			if _, err := c.Claim(ctx, target, "sandbox-k", ""); err != nil {
				t.Fatal(err)
			}
			continue
		}
		break
	}

	d.restart()
	release() // before KeepClaims watches again: it waits a second after a broken watch
	select {
	case r := <-reclaims:
		if r.Err != nil || r.Reason != crustv1.ReleaseReason_RELEASE_REASON_FORCED || r.Volume.GetClaim().GetSandboxId() != "sandbox-k" {
			t.Errorf("claimed again %+v; want the forced release seen and the claim made again", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("KeepClaims did not claim again")
	}
}
