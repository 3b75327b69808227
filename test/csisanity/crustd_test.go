package csisanity

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil/harness"
)

// realCrustd is a real crustd in this process for the deferred run, with a watch that counts what it did.
type realCrustd struct {
	socket string
	volume crustv1.VolumeServiceClient
	mu     sync.Mutex
	events map[crustv1.EventType]int
}

// startCrustd starts crustd with kubelet as its kubelet root and the loop devices the driver's volumes
// are allowed, and watches it until the test ends.
func startCrustd(t *testing.T, dir, kubelet string) *realCrustd {
	t.Helper()
	c := &realCrustd{socket: filepath.Join(dir, "run", "crust.sock"), events: map[crustv1.EventType]int{}}
	if err := os.MkdirAll(kubelet, 0o750); err != nil {
		t.Fatal(err)
	}
	cfg := daemon.Defaults()
	cfg.Socket, cfg.StateDir, cfg.KataDir, cfg.KubeletDir, cfg.HTTPAddr = c.socket, filepath.Join(dir, "crustd"), "", kubelet, ""
	cfg.DeviceAllow = []string{"/dev/loop*", "/dev/dm-*"}
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	go func() { defer close(exited); _ = daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-exited })
	wctx, wcancel := harness.Context(t, time.Minute)
	defer wcancel()
	if err := harness.WaitServing(wctx, c.socket, exited); err != nil {
		t.Fatalf("crustd not serving: %v", err)
	}
	conn, err := crustd.Dial(c.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c.volume = crustv1.NewVolumeServiceClient(conn)
	w, err := crustv1.NewRuntimeServiceClient(conn).WatchVolumes(ctx, &crustv1.WatchVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			ev, err := w.Recv()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.events[ev.GetType()]++
			c.mu.Unlock()
		}
	}()
	return c
}

// check fails t unless the run deferred volumes (crustd held descriptors), expanded one before any claim
// (a recorded requested size), and left no descriptor behind.
func (c *realCrustd) check(t *testing.T) {
	t.Helper()
	// Let the watch catch up with the last unstage: every deposit is unstaged by the end of the run (the
	// list below checks that crustd holds none), so the stream has caught up once it has shown as many
	// unstages as deposits.
	ctx, cancel := harness.Context(t, 10*time.Second)
	defer cancel()
	_ = harness.Poll(ctx, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.events[crustv1.EventType_EVENT_TYPE_UNSTAGED] >= c.events[crustv1.EventType_EVENT_TYPE_STAGED], nil
	})
	c.mu.Lock()
	staged, expanded, claimed := c.events[crustv1.EventType_EVENT_TYPE_STAGED], c.events[crustv1.EventType_EVENT_TYPE_EXPANDED],
		c.events[crustv1.EventType_EVENT_TYPE_CLAIMED]
	c.mu.Unlock()
	t.Logf("crustd: %d descriptors deposited, %d expansions recorded before a claim, %d claims", staged, expanded, claimed)
	if staged == 0 || expanded == 0 || claimed != 0 {
		t.Errorf("the deferred run deposited %d descriptors, recorded %d expansions and saw %d claims; want some, some, none",
			staged, expanded, claimed)
	}
	l, err := c.volume.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{})
	if err != nil || len(l.GetVolumes()) != 0 {
		t.Errorf("descriptors left in crustd: %v (%v)", l.GetVolumes(), err)
	}
}
