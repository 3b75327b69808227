package manager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev/sysfstree"
	"crust.dev/crust/internal/katadir"
)

// pmemNode makes a device node under the env's device directory for a persistent-memory namespace of
// size bytes that the env's sysfs tree describes (its parent on the nd bus), and returns its path. It
// reopens the manager with /dev/pmem* allowed.
func (e *env) pmemNode(name string, minor uint32, size int64) string {
	e.t.Helper()
	p := filepath.Join(e.devDir, name)
	if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(259, minor))); err != nil {
		e.t.Fatal(err)
	}
	ns := fmt.Sprintf("platform/ndbus0/region%d/namespace%d.0", minor, minor)
	if err := sysfstree.Add(e.sysfs, sysfstree.Device{Dir: ns + "/block/" + name, Major: 259, Minor: minor, Name: name,
		Parent: ns, Subsystem: "bus/nd", Files: map[string]string{"size": fmt.Sprintf("%d\n", size/512)}}); err != nil {
		e.t.Fatal(err)
	}
	if !slices.Contains(e.allow, "/dev/pmem*") { // the kernel's name for it must be allowed too
		e.allow = append(e.allow, "/dev/pmem*")
		e.reopen()
	}
	return p
}

// TestKataCaveats: the Kata adapter gives a pmem volume its Kata caveat in every Get, List and Watch
// answer (the server annotates each with it), a block volume none, and the caveat is never stored (the
// manager's own record, and a restarted manager's, have none).
func TestKataCaveats(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pmem := e.spec(0, 0)
	pmem.VolumeType, pmem.VolumeBackingPath = crustv1.VolumeType_VOLUME_TYPE_PMEM, e.pmemNode("pmem0", 900, 8<<20)
	block := e.spec(1, 1)
	w := e.m.Watch(true)
	defer w.Stop()
	for _, s := range []*crustv1.VolumeSpec{pmem, block} {
		e.stage(s)
	}
	want := func(v *crustv1.Volume) []string {
		if v.GetSpec().GetVolumeType() == crustv1.VolumeType_VOLUME_TYPE_PMEM {
			return []string{katadir.PmemCaveat}
		}
		return nil
	}
	check := func(how string, v *crustv1.Volume) {
		t.Helper()
		if got := e.k.Annotate(v).GetKataCaveats(); !slices.Equal(got, want(v)) {
			t.Errorf("%s %s: kata_caveats %q, want %q", how, v.GetSpec().GetVolumeTargetPath(), got, want(v))
		}
	}
	for _, s := range []*crustv1.VolumeSpec{pmem, block} {
		v, err := e.m.Get(ctx, s.GetVolumeTargetPath())
		if err != nil {
			t.Fatal(err)
		}
		check("Get", v)
	}
	for _, v := range e.m.List(ctx) {
		check("List", v)
	}
	for range 3 { // SYNCED, then the two stages
		ev := <-w.Events()
		if ev.GetVolume() != nil {
			check("Watch "+ev.GetType().String(), ev.GetVolume())
		}
	}
	w2 := e.m.Watch(true)
	for ev := range w2.Events() {
		if ev.GetType() == crustv1.EventType_EVENT_TYPE_SYNCED {
			break
		}
		check("Watch "+ev.GetType().String(), ev.GetVolume())
	}
	w2.Stop()
	if c := e.m.get(pmem.GetVolumeTargetPath()).GetKataCaveats(); c != nil {
		t.Errorf("the stored volume carries caveats %q", c)
	}
	e.reopen()
	if c := e.m.get(pmem.GetVolumeTargetPath()).GetKataCaveats(); c != nil {
		t.Errorf("the volume loaded from the store carries caveats %q", c)
	}
	if !strings.Contains(katadir.PmemCaveat, "without DAX") {
		t.Errorf("the pmem caveat does not say that Kata mounts it without DAX: %q", katadir.PmemCaveat)
	}
}

// TestExpandPmemIsUnimplemented: expanding a pmem volume is ErrUnimplemented, claimed or not, and changes
// nothing: no requested size recorded, no event.
func TestExpandPmemIsUnimplemented(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.spec(0, 0)
	s.VolumeType, s.VolumeBackingPath = crustv1.VolumeType_VOLUME_TYPE_PMEM, e.pmemNode("pmem0", 900, 8<<20)
	e.stage(s)
	tp := s.GetVolumeTargetPath()
	before := e.m.get(tp)
	w := e.m.Watch(false)
	defer w.Stop()
	for _, claimed := range []bool{false, true} {
		if claimed {
			if _, err := e.m.Claim(ctx, tp, "sb1", ""); err != nil {
				t.Fatal(err)
			}
			before = e.m.get(tp)
			<-w.Events() // the claim's
		}
		_, err := e.m.Expand(ctx, tp, 16<<20, 0)
		if !errors.Is(err, errdefs.ErrUnimplemented) || !strings.Contains(err.Error(), "persistent memory") {
			t.Errorf("expand (claimed %t): %v; want ErrUnimplemented saying it is persistent memory", claimed, err)
		}
		if after := e.m.get(tp); !proto.Equal(before, after) {
			t.Errorf("expand (claimed %t) changed the volume:\n%v\n%v", claimed, before, after)
		}
		select {
		case ev := <-w.Events():
			t.Errorf("expand (claimed %t) sent an event: %v", claimed, ev)
		default:
		}
	}
}

// A volume with I/O limits gets the Kata caveat for them from the Kata adapter in Get, List and Watch
// answers (existing and new); one without gets none; the caveat is never stored.
func TestKataCaveatIOLimits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	limited := e.spec(0, 0)
	limited.IoLimits = &crustv1.IOLimits{TotalIops: 50}
	e.stage(limited)
	w := e.m.Watch(true)
	defer w.Stop()
	e.stage(e.spec(1, 1))
	caveated := func(v *crustv1.Volume) bool {
		c := e.k.Annotate(v).GetKataCaveats()
		return len(c) == 1 && strings.Contains(c[0], "I/O limits")
	}
	want := map[string]bool{e.target(0): true, e.target(1): false}
	for target, wantCaveat := range want {
		v, err := e.m.Get(ctx, target)
		if err != nil || caveated(v) != wantCaveat || (!wantCaveat && len(e.k.Annotate(v).GetKataCaveats()) > 0) {
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
