package manager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/internal/katadir"
)

// rawBlockSpec is e.spec(i, device) as a raw block volume.
func (e *env) rawBlockSpec(i, device int) *crustv1.VolumeSpec {
	s := e.spec(i, device)
	s.VolumeMode, s.FsType, s.MountFlags = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", nil
	return s
}

// TestRawBlockHasNoKataProjection: a raw block descriptor is held, claimed and released as any other,
// but nothing of it is written into the Kata directory (Kata would mount it as a filesystem), every
// answer (Stage, Get, List, Watch) says so in kata_caveats, and the caveat is never stored. Whatever sits
// where its Kata directory would be is not crust's: it is no claim, no problem, and an unstage leaves it.
func TestRawBlockHasNoKataProjection(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.m.Watch(false)
	defer w.Stop()
	wantCaveat := func(what string, v *crustv1.Volume) {
		t.Helper()
		if c := e.k.Annotate(v).GetKataCaveats(); !slices.Equal(c, []string{katadir.RawBlockCaveat}) {
			t.Fatalf("%s: kata_caveats %q, want the raw block caveat", what, c)
		}
	}

	raw, fsTarget := e.target(0), e.target(1)
	v, err := e.m.Stage(ctx, e.rawBlockSpec(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	wantCaveat("stage", v)
	if v, err = e.m.Stage(ctx, e.rawBlockSpec(0, 0)); err != nil {
		t.Fatalf("the same raw block spec again: %v", err)
	}
	wantCaveat("repeated stage", v)
	e.stage(e.spec(1, 1))
	if ev := <-w.Events(); ev.GetType() != crustv1.EventType_EVENT_TYPE_STAGED {
		t.Fatalf("first event %v", ev)
	} else {
		wantCaveat("watch event", ev.GetVolume())
	}
	if ev := <-w.Events(); len(e.k.Annotate(ev.GetVolume()).GetKataCaveats()) != 0 {
		t.Fatalf("a filesystem volume has caveats %q", e.k.Annotate(ev.GetVolume()).GetKataCaveats())
	}
	if _, err := os.Lstat(e.volDir(raw)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the raw block volume has a Kata directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.volDir(fsTarget), kata.MountInfoFileName)); err != nil {
		t.Fatalf("the filesystem volume beside it is not projected: %v", err)
	}

	// Answers after a restart, which rebuilds the projection: still none for it.
	e.reopen()
	if _, err := os.Lstat(e.volDir(raw)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a restart projected the raw block volume: %v", err)
	}
	got, err := e.m.Get(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	wantCaveat("get", got)
	if got.GetSpec().GetVolumeMode() != crustv1.VolumeMode_VOLUME_MODE_BLOCK {
		t.Fatalf("stored mode %v", got.GetSpec().GetVolumeMode())
	}
	for _, l := range e.m.List(ctx) {
		if l.GetSpec().GetVolumeTargetPath() == raw {
			wantCaveat("list", l)
		} else if c := e.k.Annotate(l).GetKataCaveats(); len(c) != 0 {
			t.Fatalf("list: a filesystem volume has caveats %q", c)
		}
	}
	sw := e.m.Watch(true)
	for ev := range sw.Events() {
		if ev.GetType() == crustv1.EventType_EVENT_TYPE_SYNCED {
			break
		}
		if ev.GetVolume().GetSpec().GetVolumeTargetPath() == raw {
			wantCaveat("existing event", ev.GetVolume())
		}
	}
	sw.Stop()
	// What the store holds, as a start reads it back: the volume, without its caveat.
	e.reopen()
	records := 0
	for _, v := range e.loaded.Volumes {
		if v.GetSpec().GetVolumeTargetPath() == raw {
			records++
		}
		if len(v.GetKataCaveats()) != 0 {
			t.Errorf("the caveat was stored with %s: %v", v.GetSpec().GetVolumeTargetPath(), v.GetKataCaveats())
		}
	}
	if records != 1 {
		t.Fatalf("the store holds %d records of the volume, want 1", records)
	}

	// Something planted where its Kata directory would be: a sandbox id there is no claim of it.
	if err := os.Mkdir(e.volDir(raw), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.volDir(raw), "katasb"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := e.m.Get(ctx, raw); err != nil || got.GetClaim() != nil {
		t.Fatalf("get: %v, claim %v from a Kata directory crust never wrote", err, got.GetClaim())
	}
	e.wantProblems()

	// Crust's own handlers claim and release it as any volume.
	if c, err := e.m.Claim(ctx, raw, "sb1", ""); err != nil || c.GetClaim().GetSandboxId() != "sb1" {
		t.Fatalf("claim: %v, %v", c, err)
	}
	if _, err := e.m.Claim(ctx, raw, "sb2", ""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a second sandbox's claim: %v, want FailedPrecondition", err)
	}
	if err := e.m.Release(ctx, raw, "sb1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Unstage(ctx, raw); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.volDir(raw), "katasb")); err != nil {
		t.Fatalf("unstage removed a Kata directory crust did not write: %v", err)
	}
}

// TestRawBlockTargetNeedsNoKataName: a raw block volume has no Kata directory, so a target path too long
// to name one is staged all the same, with the projection on.
func TestRawBlockTargetNeedsNoKataName(t *testing.T) {
	e := newEnv(t)
	s := e.longSpec()
	s.VolumeMode, s.FsType, s.MountFlags = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", nil
	if _, err := e.m.Stage(context.Background(), s); err != nil {
		t.Fatalf("stage of a raw block volume at a target Kata cannot name: %v", err)
	}
	e.reopen()
	e.wantProblems()
}

// TestRawBlockStatsBeforeAnyClaim: before a sandbox holds a raw block volume, stats are the device's size
// and a condition that speaks of a raw volume, not of a filesystem to measure later.
func TestRawBlockStatsBeforeAnyClaim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stageLoop(e.rawBlockSpec(0, 0), 8<<20)
	st, err := e.m.Stats(ctx, e.target(0))
	if err != nil {
		t.Fatal(err)
	}
	if u := st.GetUsage(); len(u) != 1 || u[0].GetTotal() != 8<<20 || st.GetVolumeCondition().GetMessage() != NotAttachedRawMessage {
		t.Fatalf("stats %v; want the device's size and %q", st, NotAttachedRawMessage)
	}
}
