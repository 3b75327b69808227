package manager

import (
	"context"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// SandboxFinder finds the Kata sandbox of a pod without the sandbox's help (crisandbox.Finder does,
// through the CRI runtime and the Kata shim directories).
type SandboxFinder interface {
	// KataSandboxes returns the ids of the pod's sandboxes that are ready and served by a Kata shim. An
	// error means the answer is unknown (the runtime did not answer in time).
	KataSandboxes(ctx context.Context, podUID string) ([]string, error)
}

// DiscoverKataClaim looks for the Kata sandbox that uses the volume at target when nothing claims it
// (no claim of crust's, no sandbox-id file: Kata's runtime-rs records none) and records it as the
// volume's claim, durably, with kata and cri_discovered set; watchers get EVENT_TYPE_CLAIMED. It returns
// the volume as it then is, or nil when it recorded nothing: the volume is claimed already or unknown,
// discovery is off (no SandboxFinder, or no Kata projection, so no Kata runtime can use the volume),
// the target is in no pod's directory, the pod has no Kata sandbox or more than one (a warning: which
// one uses the volume cannot be told), the device is no longer the one staged, another sandbox writes
// to the device, or the runtime did not answer. Stats and Expand call it before answering from the host;
// crustd also calls it periodically. It never holds the target's lock while the runtime is asked.
func (m *Manager) DiscoverKataClaim(ctx context.Context, target string) *crustv1.Volume {
	v, _ := m.discover(ctx, target)
	return v
}

// discover is DiscoverKataClaim that also returns the finder's error (the runtime did not answer).
func (m *Manager) discover(ctx context.Context, target string) (*crustv1.Volume, error) {
	if m.cfg.Sandboxes == nil || !m.cfg.Projection.Enabled() {
		return nil, nil
	}
	v := m.get(target)
	if v == nil || m.withKataClaim(v).GetClaim() != nil {
		return nil, nil
	}
	uid := m.podUID(v)
	if uid == "" {
		return nil, nil
	}
	ids, err := m.cfg.Sandboxes.KataSandboxes(ctx, uid)
	if err != nil || len(ids) == 0 {
		return nil, err // the finder logs a runtime that does not answer
	}
	if len(ids) > 1 {
		m.noteOnce(target, "ambiguous "+strings.Join(ids, ","), func() {
			m.log.Warn("the pod of a Kata volume has several Kata sandboxes; none is recorded as its claim",
				"target", target, "pod_uid", uid, "sandboxes", ids)
		})
		return nil, nil
	}
	unlock, err := m.locks.Lock(ctx, target)
	if err != nil {
		return nil, nil // busy: the next call comes back to it
	}
	defer unlock()
	old := m.get(target)
	if old == nil || m.withKataClaim(old).GetClaim() != nil {
		return nil, nil
	}
	if err := m.cfg.Validator.SameDevice(old); err != nil {
		return nil, nil // stats and expand from the host say so
	}
	unlockDev, err := m.locks.Lock(ctx, deviceKey(old.GetDeviceNumber()))
	if err != nil {
		return nil, nil
	}
	defer unlockDev()
	if err := m.oneWriter(old, ids[0]); err != nil {
		m.noteOnce(target, "one writer "+ids[0], func() {
			m.log.Warn("the Kata sandbox found for a volume is not recorded as its claim", "target", target,
				"sandbox", ids[0], "err", err)
		})
		return nil, nil
	}
	nv := proto.CloneOf(old)
	nv.Claim = &crustv1.Claim{SandboxId: ids[0], Kata: true, CriDiscovered: true, ClaimTime: timestamppb.Now()}
	if err := m.cfg.Store.Put(nv); err != nil {
		m.log.Error("store the claim of a Kata sandbox found through the CRI runtime", "target", target, "err", err)
		return nil, nil
	}
	m.commit(target, nv, crustv1.EventType_EVENT_TYPE_CLAIMED)
	m.log.Info("Kata sandbox found through the CRI runtime; recorded as the volume's claim", "target", target,
		"sandbox", ids[0], "pod_uid", uid)
	return nv, nil
}

// DiscoverKataClaims runs DiscoverKataClaim for every volume nothing claims, and returns the target paths
// it recorded a claim for. It stops at the first volume the runtime gives no answer for, so a runtime
// that does not answer costs one timeout per pass, whatever the number of volumes.
func (m *Manager) DiscoverKataClaims(ctx context.Context) []string {
	if m.cfg.Sandboxes == nil || !m.cfg.Projection.Enabled() {
		return nil
	}
	m.mu.RLock()
	var unclaimed []string
	for t, v := range m.vols {
		if v.GetClaim() == nil {
			unclaimed = append(unclaimed, t)
		}
	}
	m.mu.RUnlock()
	var found []string
	for _, t := range unclaimed {
		if ctx.Err() != nil {
			break
		}
		v, err := m.discover(ctx, t)
		if err != nil {
			break
		}
		if v != nil {
			found = append(found, t)
		}
	}
	return found
}

// podUID is the UID of v's pod: the one whose kubelet directory holds v's target
// (<kubelet>/pods/<uid>/...), else the spec's pod_uid (validation made sure the two agree), else "".
func (m *Manager) podUID(v *crustv1.Volume) string {
	if uid := podDirOf(m.cfg.KubeletDir, v.GetSpec().GetVolumeTargetPath()); uid != "" {
		return uid
	}
	return v.GetSpec().GetPodUid()
}

// podDirOf is the name of the pod directory under <kubeletDir>/pods that holds target, or "".
func podDirOf(kubeletDir, target string) string {
	rel, err := filepath.Rel(filepath.Join(kubeletDir, "pods"), target)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return ""
	}
	uid, _, _ := strings.Cut(rel, string(filepath.Separator))
	return uid
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
