package manager

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// Before any sandbox claims a volume, stats answer from the device and expansion grows the host's view
// of the device and records the size asked for, durably; a claim used to be required for both.
func TestStatsAndExpandBeforeAnyClaim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, img := e.stageLoop(e.spec(0, 0), 8<<20)
	tp := e.target(0)

	wantStats := func(step string, total int64) {
		t.Helper()
		st, err := e.m.Stats(ctx, tp)
		if err != nil {
			t.Fatalf("%s: stats before a claim: %v", step, err)
		}
		u := st.GetUsage()
		if len(u) != 1 || u[0].GetUnit() != crustv1.VolumeUsage_UNIT_BYTES || u[0].GetTotal() != total ||
			u[0].GetUsed() != 0 || u[0].GetAvailable() != 0 {
			t.Fatalf("%s: usage %v; want one bytes entry, total %d, used and available unknown", step, u, total)
		}
		if c := st.GetVolumeCondition(); c.GetAbnormal() || c.GetMessage() != NotMountedMessage {
			t.Fatalf("%s: condition %v; want not abnormal, %q", step, c, NotMountedMessage)
		}
	}
	wantRequested := func(step string, n int64) {
		t.Helper()
		v, err := e.m.Get(ctx, tp)
		if err != nil || v.GetRequestedBytes() != n {
			t.Fatalf("%s: requested_bytes %d (%v); want %d", step, v.GetRequestedBytes(), err, n)
		}
	}
	wantStats("staged", 8<<20)

	// The controller grows the backing volume; the loop device does not know yet.
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	wantStats("backing grown, device not told", 8<<20)
	w := e.m.Watch(false)
	defer w.Stop()
	if got, err := e.m.Expand(ctx, tp, 12<<20, 0); err != nil || got != 16<<20 {
		t.Fatalf("expand before a claim: %d, %v; want the device's %d", got, err, 16<<20)
	}
	if ev := <-w.Events(); ev.GetType() != crustv1.EventType_EVENT_TYPE_EXPANDED || ev.GetVolume().GetRequestedBytes() != 12<<20 {
		t.Fatalf("event %v %d; want EXPANDED with requested_bytes %d", ev.GetType(), ev.GetVolume().GetRequestedBytes(), 12<<20)
	}
	wantStats("expanded", 16<<20)
	e.reopen() // the recorded size is durable
	wantRequested("after a restart", 12<<20)

	for _, tc := range []struct {
		name      string
		required  int64
		want      string
		requested int64
	}{
		{"smaller again keeps the larger", 10 << 20, "ok", 12 << 20},
		{"the device's whole size", 16 << 20, "ok", 16 << 20},
		{"past the device is refused", 32 << 20, "failed precondition", 16 << 20},
		{"no size", 0, "invalid argument", 16 << 20},
	} {
		got, err := e.m.Expand(ctx, tp, tc.required, 0)
		if code(err) != tc.want || (err == nil && got != 16<<20) {
			t.Fatalf("%s: %d, %v; want %s", tc.name, got, err, tc.want)
		}
		wantRequested(tc.name, tc.requested)
	}

	other := e.target(1)
	if _, err := e.m.Stats(ctx, other); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stats of an unknown target: %v; want NotFound", err)
	}
	if _, err := e.m.Expand(ctx, other, 1, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("expand of an unknown target: %v; want NotFound", err)
	}
	// Claimed, stats and expansion are the handler's: this crustd has no forwarder.
	if _, err := e.m.Claim(ctx, tp, "sb1", "unix:///run/h1.sock"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Stats(ctx, tp); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("stats of a claimed volume without a forwarder: %v", err)
	}
}

// Before a claim, a device that is no longer the one staged is neither measured nor refreshed: stats and
// expansion answer FailedPrecondition and nothing is recorded.
func TestStatsAndExpandBeforeAnyClaimCheckTheDevice(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	e.mknod("disk0", 8, 16) // another device now answers to the staged path
	if _, err := e.m.Stats(ctx, e.target(0)); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "now device 8:16") {
		t.Fatalf("stats of a swapped device: %v, want FailedPrecondition naming the new device", err)
	}
	if _, err := e.m.Expand(ctx, e.target(0), 1<<20, 0); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "now device 8:16") {
		t.Fatalf("expand of a swapped device: %v, want FailedPrecondition naming the new device", err)
	}
	if v, err := e.m.Get(ctx, e.target(0)); err != nil || v.GetRequestedBytes() != 0 {
		t.Fatalf("requested_bytes %d after a refused expansion (%v)", v.GetRequestedBytes(), err)
	}
}
