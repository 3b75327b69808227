package handler

import (
	"context"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// Reclaim reports one claim made again by KeepClaims: the target, why crustd had ended the claim, and the
// outcome (the volume as claimed, or the error; FailedPrecondition means another sandbox claimed it first).
type Reclaim struct {
	Target string
	// Reason is who ended the claim (RELEASE_REASON_HANDLER_GONE when crustd took the handler for dead);
	// RELEASE_REASON_UNSPECIFIED when the claim was found missing as the watch (re)started.
	Reason crustv1.ReleaseReason
	// Detail is crustd's explanation, when it gave one.
	Detail string
	Volume *crustv1.Volume
	Err    error
}

// KeepClaims keeps the claims of a live handler: until ctx ends, it watches crustd and claims again, for
// sandboxID with endpoint, each volume for which holds(target) is true (the handler still uses it) once it
// sees that volume's claim ended while the handler was not the one to end it: crustd found the handler's
// endpoint refusing and took it for dead, or an operator forced the release. A handler must make holds false
// before it releases a volume itself, so that its own releases are left alone. When the watch (re)starts, a
// volume the handler holds that crustd shows unclaimed is claimed again too, so a release missed while the
// watch was broken is caught. report, when not nil, is called after each claim made again, refusals included:
// a claim crustd refuses (another sandbox claimed the volume first, or crustd cannot see endpoint's socket)
// is reported, not tried again. A broken watch is resumed after a second, after the last revision it saw
// (SinceRevision) when crustd can, so that a release made meanwhile is seen as one; KeepClaims returns nil
// when ctx ends.
func (c *Client) KeepClaims(ctx context.Context, sandboxID, endpoint string, holds func(target string) bool, report func(Reclaim)) error {
	reclaim := func(target string, reason crustv1.ReleaseReason, detail string) {
		v, err := c.Claim(ctx, target, sandboxID, endpoint)
		if ctx.Err() != nil {
			return
		}
		if report != nil {
			report(Reclaim{Target: target, Reason: reason, Detail: detail, Volume: v, Err: err})
		}
	}
	var opts []WatchOption // after the first watch: resume after the last revision seen
	for ctx.Err() == nil {
		_ = c.Watch(ctx, true, func(ev *crustv1.WatchVolumesResponse) error {
			if ev.GetType() != crustv1.EventType_EVENT_TYPE_EXISTING {
				opts = []WatchOption{SinceRevision(ev.GetRevision())}
			}
			target := ev.GetVolume().GetSpec().GetVolumeTargetPath()
			switch ev.GetType() {
			case crustv1.EventType_EVENT_TYPE_EXISTING:
				if ev.GetVolume().GetClaim() == nil && holds(target) {
					reclaim(target, crustv1.ReleaseReason_RELEASE_REASON_UNSPECIFIED, "")
				}
			case crustv1.EventType_EVENT_TYPE_RELEASED:
				if ev.GetReleasedClaim().GetSandboxId() == sandboxID && ev.GetVolume().GetClaim() == nil && holds(target) {
					reclaim(target, ev.GetReleaseReason(), ev.GetDetail())
				}
			}
			return nil
		}, opts...)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}
