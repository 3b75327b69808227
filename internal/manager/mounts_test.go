package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// hostMounts is the host's mount table as a test sets it: where each device number is mounted.
type hostMounts struct {
	mu sync.Mutex
	at map[[2]uint32]string
}

func (h *hostMounts) mount(major, minor uint32, point string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at == nil {
		h.at = map[[2]uint32]string{}
	}
	if point == "" {
		delete(h.at, [2]uint32{major, minor})
	} else {
		h.at[[2]uint32{major, minor}] = point
	}
}

// NotMounted implements HostMounts.
func (h *hostMounts) NotMounted(v *crustv1.Volume) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	dn := v.GetDeviceNumber()
	if p, ok := h.at[[2]uint32{dn.GetMajor(), dn.GetMinor()}]; ok {
		return fmt.Errorf("%s is mounted at %s: %w", v.GetResolvedBackingPath(), p, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// TestMountedDeviceIsRefused: a device the host has mounted is neither staged (nothing stored, nothing
// projected for Kata, a descriptor already held kept) nor claimed (a repeat claim included), with
// FailedPrecondition naming the mount point; unmounted, it is.
func TestMountedDeviceIsRefused(t *testing.T) {
	e := newEnv(t)
	h := &hostMounts{}
	e.mounts = h
	e.reopen()
	ctx := context.Background()
	tp := e.target(0)
	const point = "/mnt/on-the-host"

	wantRefused := func(what string, err error) {
		t.Helper()
		if code(err) != "failed precondition" || !strings.Contains(err.Error(), point) {
			t.Fatalf("%s of a mounted device: %v; want FailedPrecondition naming %s", what, err, point)
		}
	}
	claimer := func() string {
		t.Helper()
		v, err := e.m.Get(ctx, tp)
		if err != nil {
			t.Fatal(err)
		}
		return v.GetClaim().GetSandboxId()
	}

	h.mount(7, 100, point) // disk0
	_, err := e.m.Stage(ctx, e.spec(0, 0))
	wantRefused("stage", err)
	if _, err := os.Stat(e.volDir(tp)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused stage left its Kata volume directory: %v", err)
	}
	e.wantNothingHeld()
	h.mount(7, 100, "")
	e.stage(e.spec(0, 0))

	h.mount(7, 100, point)
	_, err = e.m.Stage(ctx, e.spec(0, 0))
	wantRefused("a repeated stage", err)
	_, err = e.m.Claim(ctx, tp, "sb1", "")
	wantRefused("claim", err)
	if c := claimer(); c != "" {
		t.Fatalf("a refused claim left the claim of %q", c)
	}

	h.mount(7, 100, "")
	if _, err := e.m.Claim(ctx, tp, "sb1", ""); err != nil {
		t.Fatalf("claim once unmounted: %v", err)
	}
	h.mount(7, 100, point)
	_, err = e.m.Claim(ctx, tp, "sb1", "unix:///run/h.sock")
	wantRefused("a repeated claim", err)
	if c := claimer(); c != "sb1" {
		t.Fatalf("after a refused repeat claim the holder is %q, want sb1 still", c)
	}
}
