package manager

import (
	"context"
	"strings"

	"crust.dev/crust/pkg/volume"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"crust.dev/crust/internal/kata"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// SandboxFinder finds the Kata sandboxes of pods without the sandboxes' help (crisandbox.Finder does,
// through the CRI runtime and the Kata shim directories).
type SandboxFinder interface {
	// KataSandboxes returns the ids of the ready sandboxes served by a Kata shim, by pod UID: of the pod
	// podUID, or of every pod when podUID is "". An error means the answer is unknown (the runtime did
	// not answer in time).
	KataSandboxes(ctx context.Context, podUID string) (map[string][]string, error)
}

// DiscoverKataClaim looks for the Kata sandbox that uses the volume at target when nothing claims it
// (no claim of crust's, no sandbox-id file: Kata's runtime-rs records none) and records it as the
// volume's claim, durably, with kata and cri_discovered set; watchers get EVENT_TYPE_CLAIMED. It returns
// the volume as it then is, or nil when it recorded nothing: the volume is claimed already or unknown,
// discovery is off (no SandboxFinder, or no Kata projection, so no Kata runtime can use the volume),
// the target is in no pod's directory, the volume is raw block (never projected for Kata), the pod has no Kata sandbox or more than one (a warning: which
// one uses the volume cannot be told), the device is no longer the one staged, another sandbox writes
// to the device, or the runtime did not answer. Stats and Expand call it before answering from the host.
// It never holds the target's lock while the runtime is asked.
func (m *Manager) DiscoverKataClaim(ctx context.Context, target string) *crustv1.Volume {
	if m.cfg.Sandboxes == nil || !m.cfg.Projection.Enabled() {
		return nil
	}
	v := m.get(target)
	if v == nil || m.withKataClaim(v).GetClaim() != nil {
		return nil
	}
	uid := m.podUID(v)
	if uid == "" {
		return nil
	}
	byPod, err := m.cfg.Sandboxes.KataSandboxes(ctx, uid)
	if err != nil {
		return nil // the finder logs a runtime that does not answer
	}
	return m.recordKataClaim(ctx, target, uid, byPod[uid])
}

// DiscoverKataClaims does what DiscoverKataClaim does for every volume nothing claims, with one question
// to the runtime for all of them (none when no volume lies in a pod's directory unclaimed), and returns
// the target paths it recorded a claim for. crustd calls it periodically.
func (m *Manager) DiscoverKataClaims(ctx context.Context) []string {
	if m.cfg.Sandboxes == nil || !m.cfg.Projection.Enabled() {
		return nil
	}
	m.mu.RLock()
	unclaimed := map[string]string{} // target -> pod UID
	for t, v := range m.vols {
		if v.GetClaim() == nil {
			if uid := m.podUID(v); uid != "" {
				unclaimed[t] = uid
			}
		}
	}
	m.mu.RUnlock()
	if len(unclaimed) == 0 {
		return nil
	}
	byPod, err := m.cfg.Sandboxes.KataSandboxes(ctx, "")
	if err != nil {
		return nil
	}
	var found []string
	for t, uid := range unclaimed {
		if ids := byPod[uid]; len(ids) > 0 && m.recordKataClaim(ctx, t, uid, ids) != nil {
			found = append(found, t)
		}
	}
	return found
}

// recordKataClaim records ids[0], the Kata sandbox found for pod uid, as the claim on target, when it is
// the only one and nothing claims target by then (see DiscoverKataClaim), and returns the volume so
// claimed, or nil.
func (m *Manager) recordKataClaim(ctx context.Context, target, uid string, ids []string) *crustv1.Volume {
	if len(ids) == 0 {
		return nil
	}
	if len(ids) > 1 {
		m.noteOnce(target, "ambiguous "+strings.Join(ids, ","), func() {
			m.log.Warn("the pod of a Kata volume has several Kata sandboxes; none is recorded as its claim",
				"target", target, "pod_uid", uid, "sandboxes", ids)
		})
		return nil
	}
	unlock, err := m.locks.Lock(ctx, target)
	if err != nil {
		return nil // busy: the next call comes back to it
	}
	defer unlock()
	old := m.get(target)
	if old == nil || m.withKataClaim(old).GetClaim() != nil {
		return nil
	}
	if err := m.cfg.Validator.SameDevice(old); err != nil {
		return nil // stats and expand from the host say so
	}
	unlockDev, err := m.locks.Lock(ctx, deviceKey(old.GetDeviceNumber()))
	if err != nil {
		return nil
	}
	defer unlockDev()
	if err := m.oneWriter(old, ids[0]); err != nil {
		m.noteOnce(target, "one writer "+ids[0], func() {
			m.log.Warn("the Kata sandbox found for a volume is not recorded as its claim", "target", target,
				"sandbox", ids[0], "err", err)
		})
		return nil
	}
	nv := proto.CloneOf(old)
	nv.Claim = &crustv1.Claim{SandboxId: ids[0], Kata: true, CriDiscovered: true, ClaimTime: timestamppb.Now()}
	if err := m.cfg.Store.Put(nv); err != nil {
		m.log.Error("store the claim of a Kata sandbox found through the CRI runtime", "target", target, "err", err)
		return nil
	}
	m.commit(target, nv, crustv1.EventType_EVENT_TYPE_CLAIMED)
	m.log.Info("Kata sandbox found through the CRI runtime; recorded as the volume's claim", "target", target,
		"sandbox", ids[0], "pod_uid", uid)
	return nv
}

// podUID is the UID of v's pod: the one whose kubelet directory holds v's target
// (<kubelet>/pods/<uid>/...), else the spec's pod_uid (validation made sure the two agree), else "". It
// is "" as well for a volume without a Kata projection (raw block): no Kata runtime takes such a
// volume from crust, so no Kata sandbox is its claimer.
func (m *Manager) podUID(v *crustv1.Volume) string {
	if !kata.Projects(v.GetSpec()) {
		return ""
	}
	if uid := volume.PodDirUID(m.cfg.KubeletDir, v.GetSpec().GetVolumeTargetPath()); uid != "" {
		return uid
	}
	return v.GetSpec().GetPodUid()
}

// forgetNotes forgets what was logged of target (it is unstaged).
func (m *Manager) forgetNotes(target string) {
	m.noteMu.Lock()
	defer m.noteMu.Unlock()
	delete(m.noted, target)
}

// noteOnce calls log the first time it is given what for target, so that a condition seen at every
// periodic pass is logged once, and again only after it changed.
func (m *Manager) noteOnce(target, what string, log func()) {
	m.noteMu.Lock()
	defer m.noteMu.Unlock()
	if m.noted == nil {
		m.noted = map[string]string{}
	}
	if m.noted[target] == what {
		return
	}
	m.noted[target] = what
	log()
}
