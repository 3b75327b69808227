package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/handler"
)

// TestDeadHandlerReleased runs crustd with --handler-grace 3s and two runtime handlers served by the test
// on real unix sockets, and checks that crustd ends the claims of the one that is gone and only of it:
//
//   - a claim made by a process that then exited (crustctl claim, for the handler's endpoint) is kept
//     while the endpoint answers, and released within a check interval, well before the grace, once the
//     endpoint refuses too (why=process_exited);
//   - a claim whose claiming process lives (the test) is released once its endpoint has refused for the
//     whole grace, not before (why=endpoint_refused); the handler, alive, sees the release
//     (RELEASE_REASON_HANDLER_GONE with a detail) and claims again through handler.KeepClaims, and
//     the claim then stays while the endpoint answers;
//   - each release is a log line and counts in crust_handler_claims_released_total{why}.
func TestDeadHandlerReleased(t *testing.T) {
	const grace = 3 * time.Second
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := l.Addr().String()
	_ = l.Close()
	d := newDaemon(t, "--handler-grace", grace.String(), "--http-addr", httpAddr)
	pod := "5d1c9e0a-0000-4000-8000-0000000dead1"
	exited, alive := d.podTarget(pod, "pvc-exited"), d.podTarget(pod, "pvc-alive")
	for _, target := range []string{exited, alive} {
		d.crustctlOK("stage", "--target-path", target, "--device", loopDevice(t, 16<<20), "--fs-type", "ext4")
	}
	rt, err := handler.Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan *crustv1.WatchVolumesResponse, 100)
	go func() {
		_ = rt.Watch(ctx, false, func(ev *crustv1.WatchVolumesResponse) error { events <- ev; return nil })
	}()
	waitEvent := func(typ crustv1.EventType, target string, within time.Duration) *crustv1.WatchVolumesResponse {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case ev := <-events:
				if ev.GetType() == typ && ev.GetVolume().GetSpec().GetVolumeTargetPath() == target {
					return ev
				}
			case <-deadline:
				t.Fatalf("no %s event for %s within %s\ncrustd log:\n%s", typ, target, within, d.Log())
			}
		}
	}
	sockDir := t.TempDir()
	serve := func(name string) func() {
		stop, _, err := handler.ServeHandler(filepath.Join(sockDir, name), crustv1.UnimplementedRuntimeHandlerServiceServer{})
		if err != nil {
			t.Fatal(err)
		}
		return stop
	}
	// Wait for the watch to be running: a claim shows up as an event.
	stopExited := serve("exited.sock")
	if _, errOut, code := d.crustctl("claim", exited, "--sandbox-id", "sb-exited", "--endpoint", "unix://"+filepath.Join(sockDir, "exited.sock")); code != 0 {
		t.Fatalf("claim: exit %d: %s", code, errOut)
	}
	ev := waitEvent(crustv1.EventType_EVENT_TYPE_CLAIMED, exited, 10*time.Second)
	if c := ev.GetVolume().GetClaim(); c.GetClaimerPid() == 0 || c.GetClaimerStartTime() == 0 {
		t.Errorf("the claim does not name the claiming process: %v", c)
	}

	// 1. The claiming process (crustctl) exited, but the endpoint answers: kept over two grace periods
	// (the time is what is under test: nothing may happen in it).
	time.Sleep(2 * grace)
	if c := getVolume(t, d, exited).GetClaim(); c == nil {
		t.Fatalf("a claim whose endpoint answers was released:\n%s", d.Log())
	}
	// Now the endpoint refuses too: released without waiting for the grace.
	stopExited()
	t0 := time.Now()
	ev = waitEvent(crustv1.EventType_EVENT_TYPE_RELEASED, exited, grace)
	took := time.Since(t0)
	t.Logf("claimer exited, endpoint refusing -> released in %s (grace %s)", took.Round(time.Millisecond), grace)
	if ev.GetReleaseReason() != crustv1.ReleaseReason_RELEASE_REASON_HANDLER_GONE || ev.GetReleasedClaim().GetSandboxId() != "sb-exited" ||
		!strings.Contains(ev.GetDetail(), "has exited") {
		t.Errorf("release event: reason %s, claim %v, detail %q", ev.GetReleaseReason(), ev.GetReleasedClaim(), ev.GetDetail())
	}
	if took >= grace {
		t.Errorf("released after %s: the exited claimer should not wait for the grace %s", took, grace)
	}

	// 2. A live handler whose endpoint refuses: released after the grace, then claimed again.
	stopAlive := serve("alive.sock")
	endpoint := "unix://" + filepath.Join(sockDir, "alive.sock")
	if _, err := rt.Claim(ctx, alive, "sb-alive", endpoint); err != nil {
		t.Fatal(err)
	}
	waitEvent(crustv1.EventType_EVENT_TYPE_CLAIMED, alive, 10*time.Second)
	reclaims := make(chan handler.Reclaim, 10)
	go func() {
		_ = rt.KeepClaims(ctx, "sb-alive", endpoint, func(target string) bool { return target == alive },
			func(r handler.Reclaim) { reclaims <- r })
	}()
	// The handler stops serving but its socket stays (as a crashed server's does): crustd sees the socket,
	// so the claim made again below is not refused for a socket it cannot see, and the endpoint refuses.
	stopAlive()
	if err := listening(filepath.Join(sockDir, "alive.sock")); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	ev = waitEvent(crustv1.EventType_EVENT_TYPE_RELEASED, alive, 3*grace)
	took = time.Since(t0)
	t.Logf("live claimer, endpoint refusing -> released in %s (grace %s)", took.Round(time.Millisecond), grace)
	if took < grace {
		t.Errorf("released after %s, before the grace %s", took, grace)
	}
	if ev.GetReleaseReason() != crustv1.ReleaseReason_RELEASE_REASON_HANDLER_GONE || !strings.Contains(ev.GetDetail(), "grace") {
		t.Errorf("release event: reason %s, detail %q", ev.GetReleaseReason(), ev.GetDetail())
	}
	stopAlive = serve("alive.sock") // the handler serves again
	defer stopAlive()
	select {
	case r := <-reclaims:
		if r.Err != nil || r.Reason != crustv1.ReleaseReason_RELEASE_REASON_HANDLER_GONE || r.Volume.GetClaim().GetSandboxId() != "sb-alive" {
			t.Errorf("claim again: %+v", r)
		}
		t.Logf("the live handler claimed again %s after the release", time.Since(t0.Add(took)).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the live handler did not claim again")
	}
	time.Sleep(2 * grace) // kept over two grace periods: nothing may happen in that time
	if c := getVolume(t, d, alive).GetClaim(); c.GetSandboxId() != "sb-alive" {
		t.Errorf("after claiming again with its endpoint answering, the claim is %v", c)
	}

	// Log and metric.
	for _, why := range []string{"process_exited", "endpoint_refused"} {
		if !strings.Contains(d.Log(), "released the claim of a runtime handler that is gone") || !strings.Contains(d.Log(), "why="+why) {
			t.Errorf("no log line for why=%s:\n%s", why, d.Log())
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{`crust_handler_claims_released_total{why="process_exited"} 1`, `crust_handler_claims_released_total{why="endpoint_refused"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
