// Package handlerwatch notices runtime handlers that are gone and ends their claims, so that a handler
// that died does not hold its volumes until an operator runs `crustctl release --force`.
//
// A handler is gone when nothing accepts connections at the endpoint it claimed with (the socket file is
// missing or nobody listens on it: ENOENT, ECONNREFUSED) for the whole grace period, or, without waiting
// for the grace, when its endpoint refuses and the process that made the claim (recorded from its peer
// credentials with its start time, so a reused pid is not mistaken for it) has exited. An endpoint that
// accepts, or answers slowly, counts as alive: only a refusal is evidence.
//
// What it does not touch: claims without an endpoint (nothing to ask; the claimer may be a one-shot tool
// such as `crustctl claim`), and claims an unmodified Kata shim recorded in the Kata projection (Kata
// runs its VM detached from the shim, so a shim that is gone does not mean the device is free).
//
// Claims crustd found through the CRI runtime (claim.cri_discovered, a Kata runtime that records no
// sandbox id) end when their sandbox is gone: no management socket of its Kata shim accepts connections
// and the CRI runtime no longer lists the sandbox as ready (a stopped sandbox's VM is stopped with it).
// A runtime that does not answer proves nothing, and the claim stays. With Discover set, each check also
// looks for the claimers of unclaimed volumes (the Kata adapter's FindAll).
//
// Each release is logged, counted in crust_handler_claims_released_total{why} and sent to watchers as
// EVENT_TYPE_RELEASED with RELEASE_REASON_HANDLER_GONE and a detail saying why. A handler that is in fact
// alive claims again (handler.Client.KeepClaims in api/handler does that).
package handlerwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/procid"
)

// Why a claim was ended, the label of the metric.
const (
	// WhyProcessExited: the claiming process has exited and its endpoint refuses.
	WhyProcessExited = "process_exited"
	// WhyEndpointRefused: the endpoint refused for the whole grace period.
	WhyEndpointRefused = "endpoint_refused"
	// WhySandboxGone: the Kata sandbox of a claim found through the CRI runtime is gone.
	WhySandboxGone = "sandbox_gone"
)

// Sandboxes says whether the Kata sandbox of a claim found through the CRI runtime is still there
// (crisandbox.Finder).
type Sandboxes interface {
	// ShimSockets returns every place the sandbox's Kata shim may serve its management socket.
	ShimSockets(sandboxID string) ([]string, error)
	// Ready reports whether the CRI runtime lists the sandbox as ready; an error when it does not answer.
	Ready(ctx context.Context, sandboxID string) (bool, error)
}

// DefaultGrace is how long an endpoint may refuse before its claims end, when the claiming process is not
// known to have exited: long enough for a handler to restart in place.
const DefaultGrace = 30 * time.Second

// Config is what a Watcher needs.
type Config struct {
	Manager *manager.Manager
	// Grace is how long an endpoint may refuse connections before its claims are ended; 0 or less turns
	// the watcher off.
	Grace time.Duration
	// Released is called once per claim ended, with the reason (WhyProcessExited, WhyEndpointRefused,
	// WhySandboxGone); nil: not called. For the metric.
	Released func(why string)
	// Sandboxes checks the sandboxes of claims found through the CRI runtime; nil: those claims are left
	// alone.
	Sandboxes Sandboxes
	// Discover looks for the claimers of the volumes nothing claims, once per check (kata.Adapter.FindAll);
	// nil: not looked for.
	Discover func(ctx context.Context) []string
	Log      *slog.Logger
}

// Watcher checks the handlers of the claims the manager holds. Use one goroutine: Run, or Check.
type Watcher struct {
	cfg     Config
	refused map[string]time.Time // endpoint -> first refusal seen in a row
}

// New returns a watcher.
func New(cfg Config) *Watcher {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Watcher{cfg: cfg, refused: map[string]time.Time{}}
}

// Interval is how often Run checks: a second, or a quarter of a shorter grace.
func (w *Watcher) Interval() time.Duration {
	return max(min(time.Second, w.cfg.Grace/4), 10*time.Millisecond)
}

// Run checks every Interval until ctx ends. It does nothing when the grace is not positive.
func (w *Watcher) Run(ctx context.Context) {
	if w.cfg.Grace <= 0 {
		return
	}
	t := time.NewTicker(w.Interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.Check(ctx, now)
		}
	}
}

// Check looks at every handler claim once, as of now, ends those whose handler is gone and returns their
// target paths. Each endpoint is probed once per call.
func (w *Watcher) Check(ctx context.Context, now time.Time) []string {
	claims := w.cfg.Manager.HandlerClaims()
	probed := map[string]error{}
	var ended []string
	sandboxes := map[string]string{} // sandbox id -> why it is gone ("" alive or unknown)
	criDown := false                 // the runtime did not answer: ask it no more in this check
	for target, c := range claims {
		if c.GetCriDiscovered() {
			if w.cfg.Sandboxes == nil {
				continue
			}
			id := c.GetSandboxId()
			detail, ok := sandboxes[id]
			if !ok {
				detail = w.sandboxGone(ctx, id, &criDown)
				sandboxes[id] = detail
			}
			if detail != "" && w.release(ctx, target, c, WhySandboxGone, detail) {
				ended = append(ended, target)
			}
			continue
		}
		ep := c.GetHandlerEndpoint()
		if ep == "" {
			continue
		}
		err, ok := probed[ep]
		if !ok {
			err = probe(ep)
			probed[ep] = err
		}
		if err == nil {
			continue
		}
		if _, ok := w.refused[ep]; !ok {
			w.refused[ep] = now
		}
		why, detail := w.verdict(c, err, now.Sub(w.refused[ep]))
		if why == "" {
			continue
		}
		if w.release(ctx, target, c, why, detail) {
			ended = append(ended, target)
		}
	}
	// Forget endpoints that answer again or are no longer claimed.
	for ep := range w.refused {
		if err, ok := probed[ep]; !ok || err == nil {
			delete(w.refused, ep)
		}
	}
	if w.cfg.Discover != nil {
		w.cfg.Discover(ctx)
	}
	return ended
}

// release ends claim c on target for why, and reports whether it did.
func (w *Watcher) release(ctx context.Context, target string, c *crustv1.Claim, why, detail string) bool {
	released, err := w.cfg.Manager.ReleaseGone(ctx, target, c, detail)
	if err != nil {
		w.cfg.Log.Error("release the claim of a runtime handler that is gone", "target", target, "err", err)
		return false
	}
	if !released {
		return false
	}
	w.cfg.Log.Warn("released the claim of a runtime handler that is gone", "target", target,
		"sandbox", c.GetSandboxId(), "endpoint", c.GetHandlerEndpoint(), "claimer_pid", c.GetClaimerPid(), "why", why, "detail", detail)
	if w.cfg.Released != nil {
		w.cfg.Released(why)
	}
	return true
}

// sandboxGone says why the Kata sandbox id is gone, or "" when it is there or that cannot be told. It
// does not ask the runtime when *criDown, and sets it when the runtime does not answer.
func (w *Watcher) sandboxGone(ctx context.Context, id string, criDown *bool) string {
	socks, err := w.cfg.Sandboxes.ShimSockets(id)
	if err != nil {
		return ""
	}
	var refused []string
	for _, s := range socks {
		err := probe(s)
		if err == nil {
			return ""
		}
		refused = append(refused, err.Error())
	}
	if *criDown {
		return ""
	}
	ready, err := w.cfg.Sandboxes.Ready(ctx, id)
	if err != nil {
		*criDown = true
		return ""
	}
	if ready {
		return ""
	}
	return fmt.Sprintf("the CRI runtime no longer lists sandbox %s as ready and no management socket of its Kata shim accepts connections (%s)",
		id, strings.Join(refused, "; "))
}

// verdict says whether c's handler is gone, given that its endpoint refused with err for refusedFor.
func (w *Watcher) verdict(c *crustv1.Claim, err error, refusedFor time.Duration) (why, detail string) {
	if pid := c.GetClaimerPid(); pid > 0 && !procid.Alive(pid, c.GetClaimerStartTime()) {
		return WhyProcessExited, fmt.Sprintf("the claiming process %d has exited and %s refuses connections (%v)",
			pid, c.GetHandlerEndpoint(), err)
	}
	if refusedFor >= w.cfg.Grace {
		return WhyEndpointRefused, fmt.Sprintf("%s has refused connections for %s, the grace period (%v)",
			c.GetHandlerEndpoint(), refusedFor.Round(time.Millisecond), err)
	}
	return "", ""
}

// probe connects to a unix endpoint and hangs up. It returns an error only when the endpoint refuses:
// no socket file, or nobody listening on it; anything else (it accepted, or is too busy to) is nil.
func probe(endpoint string) error {
	path, _ := strings.CutPrefix(endpoint, "unix:")
	if p, ok := strings.CutPrefix(path, "//"); ok {
		path = p
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = conn.Close()
		return nil
	}
	for _, refusal := range []error{syscall.ENOENT, syscall.ECONNREFUSED, syscall.ENOTSOCK, syscall.ENOTDIR} {
		if errors.Is(err, refusal) {
			return err
		}
	}
	return nil
}
