package manager

import (
	"context"
	"strings"
	"testing"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// A volume with I/O limits carries the Kata caveat for them in Get, List and Watch answers (existing and
// new); one without carries none; the caveat is never stored.
func TestKataCaveatIOLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	limited := e.spec(0, 0)
	limited.IoLimits = &crustv1.IOLimits{TotalIops: 50}
	if _, err := e.m.Stage(ctx, limited); err != nil {
		t.Fatal(err)
	}
	w := e.m.Watch(true)
	defer w.Stop()
	if _, err := e.m.Stage(ctx, e.spec(1, 1)); err != nil {
		t.Fatal(err)
	}
	caveated := func(v *crustv1.Volume) bool {
		c := v.GetKataCaveats()
		return len(c) == 1 && strings.Contains(c[0], "I/O limits")
	}
	want := map[string]bool{e.target(0): true, e.target(1): false}
	for target, wantCaveat := range want {
		v, err := e.m.Get(ctx, target)
		if err != nil || caveated(v) != wantCaveat || (!wantCaveat && len(v.GetKataCaveats()) > 0) {
			t.Errorf("Get(%s) = %v, %v; want a caveat %v", target, v.GetKataCaveats(), err, wantCaveat)
		}
	}
	for _, v := range e.m.List(ctx) {
		if caveated(v) != want[v.GetSpec().GetVolumeTargetPath()] {
			t.Errorf("List: %s has caveats %v", v.GetSpec().GetVolumeTargetPath(), v.GetKataCaveats())
		}
	}
	for range 3 { // EXISTING, SYNCED, STAGED
		ev := <-w.Events()
		if v := ev.GetVolume(); v != nil && caveated(v) != want[v.GetSpec().GetVolumeTargetPath()] {
			t.Errorf("watch %v: %s has caveats %v", ev.GetType(), v.GetSpec().GetVolumeTargetPath(), v.GetKataCaveats())
		}
	}
	e.m.mu.RLock()
	stored := e.m.vols[e.target(0)]
	e.m.mu.RUnlock()
	if len(stored.GetKataCaveats()) > 0 {
		t.Errorf("the caveats were stored: %v", stored.GetKataCaveats())
	}
	e.reopen() // and none came back from the store
	if v, err := e.m.Get(ctx, e.target(0)); err != nil || !caveated(v) {
		t.Errorf("after a restart: %v, %v", v.GetKataCaveats(), err)
	}
}
