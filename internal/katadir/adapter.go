package katadir

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/problems"
)

// Core is what the Adapter needs of crustd's core (manager.Manager has these methods).
type Core interface {
	// Held returns the descriptor at target as stored, or nil.
	Held(target string) *crustv1.Volume
	// AllHeld returns every descriptor as stored.
	AllHeld() []*crustv1.Volume
	// Locked calls fn with the descriptor at target (nil when none) under the target's lock.
	Locked(ctx context.Context, target string, fn func(held *crustv1.Volume)) error
	// PodUID is the UID of the pod a descriptor belongs to, or "".
	PodUID(v *crustv1.Volume) string
	// ClaimFound records a claim found without the claimer's help, through the ordinary claim path.
	ClaimFound(ctx context.Context, target string, c *crustv1.Claim) (*crustv1.Volume, error)
}

// SandboxFinder finds the Kata sandboxes of pods without the sandboxes' help (crisandbox.Finder does,
// through the CRI runtime and the Kata shim directories).
type SandboxFinder interface {
	// KataSandboxes returns the ids of the ready sandboxes served by a Kata shim, by pod UID: of the pod
	// podUID, or of every pod when podUID is "". An error means the answer is unknown (the runtime did
	// not answer in time).
	KataSandboxes(ctx context.Context, podUID string) (map[string][]string, error)
}

// Adapter is everything of Kata that crustd's core does without. It is the core's subscriber that keeps
// the Projection in step with the descriptors (manager.Subscriber), the claim source that reports the
// claims Kata makes its own way (manager.ClaimSource: sandbox-id files in the projection, and sandboxes
// found through the CRI runtime, recorded through the core's ordinary claim path), and the annotator
// that adds the Kata caveats to answers (Annotate). What it cannot project it quarantines: the
// descriptor stays held and served to crust's own handlers, and the problem is reported (Problems)
// until a stage or unstage of it puts the projection right.
//
// Create it with NewAdapter, give it to the manager, and Bind the manager to it before serving.
type Adapter struct {
	proj      *Projection
	sandboxes SandboxFinder
	log       *slog.Logger
	core      Core

	problems problems.Set

	noteMu sync.Mutex
	noted  map[string]string // by target: the last condition of it logged once (noteOnce)
}

// NewAdapter returns the adapter of proj. sandboxes finds the Kata sandboxes that record no sandbox id
// (nil: they are not looked for); a nil log means slog.Default().
func NewAdapter(proj *Projection, sandboxes SandboxFinder, log *slog.Logger) *Adapter {
	if log == nil {
		log = slog.Default()
	}
	return &Adapter{proj: proj, sandboxes: sandboxes, log: log}
}

// Bind gives the adapter the core it follows; until then Look and Find do nothing.
func (a *Adapter) Bind(core Core) { a.core = core }

// Load rebuilds the projection from the descriptors the store kept, and removes that of the records it
// dropped (Projection.Sync). A descriptor whose projection cannot be written, or a dropped one whose
// projection cannot be removed, is quarantined.
func (a *Adapter) Load(kept []*crustv1.Volume, dropped []string) {
	failed, err := a.proj.Sync(kept, dropped)
	if err != nil {
		a.log.Warn("rebuild the Kata projection", "err", err)
	}
	held := map[string]bool{}
	for _, v := range kept {
		held[v.GetSpec().GetVolumeTargetPath()] = true
	}
	for _, target := range slices.Sorted(maps.Keys(failed)) {
		a.quarantine(target, failed[target], held[target])
	}
}

// Check refuses nothing. A descriptor whose target path is too long for a Kata directory name
// (Nameable) is held and served to every handler but Kata, left out of the projection (Projects), and
// its Kata caveats say so (PathTooLongCaveat): refusing it would refuse the volume to crust's own
// handlers too, for a runtime the pod may not use.
func (a *Adapter) Check(*crustv1.Volume) error { return nil }

// Staged writes the projection of a descriptor just stored. Something other than a directory where its
// Kata volume directory belongs is ErrFailedPrecondition (crustd leaves it alone); any failure makes the
// manager take the record back.
func (a *Adapter) Staged(v *crustv1.Volume) error {
	if err := a.proj.Write(v); err != nil {
		return errdefs.NoSpace(fmt.Errorf("write the Kata projection of %q: %w", v.GetSpec().GetVolumeTargetPath(), err))
	}
	return nil
}

// Restaged writes the projection of a quarantined descriptor staged again; once that succeeds the
// quarantine ends. A failure is ErrNoSpace, and the descriptor stays held and quarantined.
func (a *Adapter) Restaged(v *crustv1.Volume) error {
	target := v.GetSpec().GetVolumeTargetPath()
	if !a.problems.Has(target, projectionKinds...) {
		return nil
	}
	if err := a.proj.Write(v); err != nil {
		a.quarantine(target, err, true)
		return errdefs.NoSpace(fmt.Errorf("volume %q is staged and served to crust's own handlers, but "+
			"its Kata projection cannot be written: %w", target, err))
	}
	a.healed(target)
	return nil
}

// Unstaging removes the projection of target (whatever is where its volume directory belongs), which
// ends any quarantine of it. A volume that has no projection leaves alone whatever is where it would
// be: it is not crust's. For a target the core does not hold, the projection of a dropped record that
// could not be removed at start is tried again.
func (a *Adapter) Unstaging(target string, held *crustv1.Volume) error {
	if held == nil {
		if a.problems.Has(target, projectionKinds...) && a.proj.Remove(target) == nil {
			a.healed(target)
		}
		return nil
	}
	if Projects(held.GetSpec()) {
		if err := a.proj.Remove(target); err != nil {
			return fmt.Errorf("remove the Kata projection of %q: %w", target, err)
		}
	}
	a.healed(target)
	a.noteBadNames(target, nil)
	a.forgetNotes(target)
	return nil
}

// Claim returns the claim an unmodified Kata shim recorded in v's projection (its sandbox-id file; the
// first, as Kata reads them), with kata set, or nil. A volume that has no projection has none.
func (a *Adapter) Claim(v *crustv1.Volume) *crustv1.Claim {
	if !Projects(v.GetSpec()) {
		return nil
	}
	target := v.GetSpec().GetVolumeTargetPath()
	ids, bad, err := a.proj.SandboxIDs(target)
	if err != nil {
		if !a.problems.Has(target, projectionKinds...) { // a quarantined projection is reported already
			a.log.Warn("read Kata sandbox ids", "target", target, "err", err)
		}
		return nil
	}
	a.noteBadNames(target, bad)
	if len(ids) == 0 {
		return nil
	}
	return &crustv1.Claim{SandboxId: ids[0], Kata: true}
}

// Release ends the claims a Kata shim recorded on v (its sandbox-id files): every one when force is
// set, sandboxID's otherwise; another sandbox's is ErrFailedPrecondition. It returns the claim ended,
// or nil when v has none.
func (a *Adapter) Release(v *crustv1.Volume, sandboxID string, force bool) (*crustv1.Claim, error) {
	target := v.GetSpec().GetVolumeTargetPath()
	if !Projects(v.GetSpec()) {
		return nil, nil
	}
	ids, _, err := a.proj.SandboxIDs(target)
	if err != nil || len(ids) == 0 {
		return nil, nil // an unreadable projection records no claim to end
	}
	if !force {
		if !slices.Contains(ids, sandboxID) {
			return nil, fmt.Errorf("volume %q is claimed by Kata sandbox %q, not %q: %w", target, ids[0], sandboxID, errdefs.ErrFailedPrecondition)
		}
		ids = []string{sandboxID}
	}
	for _, id := range ids {
		if err := a.proj.ForgetSandbox(target, id); err != nil {
			return nil, errdefs.NoSpace(fmt.Errorf("release Kata sandbox %q's claim on %q: %w", id, target, err))
		}
		a.log.Info("released a Kata claim", "target", target, "sandbox", id, "force", force)
	}
	return &crustv1.Claim{SandboxId: ids[0], Kata: true}, nil
}

// Find looks for the Kata sandbox that uses the volume at target when nothing claims it (no claim of
// crust's, no sandbox-id file: Kata's runtime-rs records none) and records it as the volume's claim
// through the core's ordinary claim path (Core.ClaimFound: durably, with kata and cri_discovered set,
// the one-writer rule held; watchers get EVENT_TYPE_CLAIMED). It returns the volume as it then is, or nil
// when it recorded nothing: the volume is claimed already or unknown, discovery is off (no
// SandboxFinder, or no projection, so no Kata runtime can use the volume), the target is in no pod's
// directory, the volume is raw block (never projected for Kata), the pod has no Kata sandbox or more
// than one (a warning: which one uses the volume cannot be told), the device is no longer the one
// staged, another sandbox writes to the device, or the runtime did not answer. It never holds the
// target's lock while the runtime is asked.
func (a *Adapter) Find(ctx context.Context, target string) *crustv1.Volume {
	if !a.discovering() {
		return nil
	}
	v := a.core.Held(target)
	if v == nil || v.GetClaim() != nil || a.Claim(v) != nil {
		return nil
	}
	uid := a.podUID(v)
	if uid == "" {
		return nil
	}
	byPod, err := a.sandboxes.KataSandboxes(ctx, uid)
	if err != nil {
		return nil // the finder logs a runtime that does not answer
	}
	return a.record(ctx, target, uid, byPod[uid])
}

// FindAll does what Find does for every volume nothing claims, with one question to the runtime for all
// of them (none when no volume lies in a pod's directory unclaimed), and returns the target paths it
// recorded a claim for. crustd calls it periodically (handlerwatch).
func (a *Adapter) FindAll(ctx context.Context) []string {
	if !a.discovering() {
		return nil
	}
	unclaimed := map[string]string{} // target -> pod UID
	for _, v := range a.core.AllHeld() {
		if v.GetClaim() == nil {
			if uid := a.podUID(v); uid != "" {
				unclaimed[v.GetSpec().GetVolumeTargetPath()] = uid
			}
		}
	}
	if len(unclaimed) == 0 {
		return nil
	}
	byPod, err := a.sandboxes.KataSandboxes(ctx, "")
	if err != nil {
		return nil
	}
	var found []string
	for t, uid := range unclaimed {
		if ids := byPod[uid]; len(ids) > 0 && a.record(ctx, t, uid, ids) != nil {
			found = append(found, t)
		}
	}
	return found
}

// discovering says whether Find looks for sandboxes at all.
func (a *Adapter) discovering() bool {
	return a.core != nil && a.sandboxes != nil && a.proj.Enabled()
}

// record records ids[0], the Kata sandbox found for pod uid, as the claim on target, when it is the only
// one and nothing claims target by then (see Find), and returns the volume so claimed, or nil.
func (a *Adapter) record(ctx context.Context, target, uid string, ids []string) *crustv1.Volume {
	if len(ids) == 0 {
		return nil
	}
	if len(ids) > 1 {
		a.noteOnce(target, fmt.Sprint("ambiguous ", ids), func() {
			a.log.Warn("the pod of a Kata volume has several Kata sandboxes; none is recorded as its claim",
				"target", target, "pod_uid", uid, "sandboxes", ids)
		})
		return nil
	}
	if v := a.core.Held(target); v == nil || v.GetClaim() != nil || a.Claim(v) != nil {
		return nil
	}
	v, err := a.core.ClaimFound(ctx, target, &crustv1.Claim{SandboxId: ids[0], Kata: true, CriDiscovered: true})
	if errors.Is(err, errdefs.ErrAborted) || errors.Is(err, errdefs.ErrNotFound) {
		return nil // busy or gone: the next call comes back to it
	}
	if err != nil {
		a.noteOnce(target, "not recorded "+ids[0], func() {
			a.log.Warn("the Kata sandbox found for a volume is not recorded as its claim", "target", target,
				"sandbox", ids[0], "err", err)
		})
		return nil
	}
	a.log.Info("Kata sandbox found through the CRI runtime; recorded as the volume's claim", "target", target,
		"sandbox", ids[0], "pod_uid", uid)
	return v
}

// podUID is the UID of v's pod (Core.PodUID), or "" for a volume without a Kata projection (raw block):
// no Kata runtime takes such a volume from crust, so no Kata sandbox is its claimer.
func (a *Adapter) podUID(v *crustv1.Volume) string {
	if !Projects(v.GetSpec()) {
		return ""
	}
	return a.core.PodUID(v)
}

// forgetNotes forgets what was logged of target (it is unstaged).
func (a *Adapter) forgetNotes(target string) {
	a.noteMu.Lock()
	defer a.noteMu.Unlock()
	delete(a.noted, target)
}

// noteOnce calls log the first time it is given what for target, so that a condition seen at every
// periodic pass is logged once, and again only after it changed.
func (a *Adapter) noteOnce(target, what string, log func()) {
	a.noteMu.Lock()
	defer a.noteMu.Unlock()
	if a.noted == nil {
		a.noted = map[string]string{}
	}
	if a.noted[target] == what {
		return
	}
	a.noted[target] = what
	log()
}
