package manager

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/procid"
)

type claimerKey struct{}

// WithClaimer returns ctx carrying the pid of the process that asks for a claim (its peer credentials),
// so that Claim records it with its start time and a dead handler can be told from a live one.
func WithClaimer(ctx context.Context, pid int32) context.Context {
	return context.WithValue(ctx, claimerKey{}, pid)
}

// claimerOf returns the claiming process recorded in ctx and its start time; zeros when unknown or
// already gone.
func claimerOf(ctx context.Context) (int32, uint64) {
	pid, _ := ctx.Value(claimerKey{}).(int32)
	if pid <= 0 {
		return 0, 0
	}
	start, err := procid.StartTime(pid)
	if err != nil {
		return 0, 0
	}
	return pid, start
}

// HandlerClaims returns the claims crust holds, by target path: those made through Claim and those a
// claim source found and recorded (ClaimFound, such as Kata sandboxes found through the CRI runtime),
// not those a claim source only reports (ClaimSource.Claim). The claims are never mutated.
func (m *Manager) HandlerClaims() map[string]*crustv1.Claim {
	m.mu.RLock()
	defer m.mu.RUnlock()
	claims := map[string]*crustv1.Claim{}
	for t, v := range m.vols {
		if c := v.GetClaim(); c != nil {
			claims[t] = c
		}
	}
	for t, v := range m.reserved {
		if v.GetUnstageTime() != nil {
			claims[t] = v.GetClaim()
		}
	}
	return claims
}

// ReleaseGone ends claim on target because its handler is gone (detail says how that was found), and
// tells watchers so with RELEASE_REASON_HANDLER_GONE. It does nothing and returns false when the volume
// no longer carries that very claim (released, or claimed again meanwhile), or when another operation
// holds the target (the next check comes back to it).
func (m *Manager) ReleaseGone(ctx context.Context, target string, claim *crustv1.Claim, detail string) (bool, error) {
	unlock, err := m.locks.Lock(ctx, target)
	if errors.Is(err, errdefs.ErrAborted) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unlock()
	old := m.record(target)
	if old == nil || !proto.Equal(old.GetClaim(), claim) {
		return false, nil
	}
	if err := m.releaseLocked(old, crustv1.ReleaseReason_RELEASE_REASON_HANDLER_GONE, detail); err != nil {
		return false, err
	}
	return true, nil
}

// releaseLocked drops old's claim, durably, and tells watchers who ended it. The caller holds the
// target's lock.
func (m *Manager) releaseLocked(old *crustv1.Volume, reason crustv1.ReleaseReason, detail string) error {
	target := old.GetSpec().GetVolumeTargetPath()
	if old.GetUnstageTime() != nil {
		return m.releaseKept(old, reason, detail)
	}
	v := proto.CloneOf(old)
	v.Claim = nil
	if err := m.cfg.Store.Put(v); err != nil {
		return errdefs.NoSpace(fmt.Errorf("store the release of %q: %w", target, err))
	}
	m.commitEvent(target, v, &crustv1.WatchVolumesResponse{Type: crustv1.EventType_EVENT_TYPE_RELEASED, Volume: v,
		ReleaseReason: reason, ReleasedClaim: old.GetClaim(), Detail: detail})
	return nil
}

// releaseReason says who ends claim through Release.
func releaseReason(force bool, sandboxID string, claim *crustv1.Claim) crustv1.ReleaseReason {
	if force && sandboxID != claim.GetSandboxId() {
		return crustv1.ReleaseReason_RELEASE_REASON_FORCED
	}
	return crustv1.ReleaseReason_RELEASE_REASON_SANDBOX
}
