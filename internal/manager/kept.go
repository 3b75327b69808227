package manager

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev"
)

// A claim outlives its descriptor. A volume unstaged while a sandbox holds it leaves a record, the
// descriptor with unstage_time set, that reserves its device for that claim: no other claim of the device,
// under any of its names, succeeds (oneWriter), until the claim is released (Release, ReleaseGone). The
// record is durable, so a restart keeps the reservation; it is not a descriptor (Get, List, Stats,
// Expand and the subscribers do not see it), and staging its target again is refused meanwhile.

// keep unstages old, which carries a claim of crust's, keeping its claim (see above), and returns that
// claim. The caller holds old's target lock.
func (m *Manager) keep(ctx context.Context, old *crustv1.Volume) (*crustv1.Claim, error) {
	target := old.GetSpec().GetVolumeTargetPath()
	m.mu.RLock()
	st := m.held[target]
	m.mu.RUnlock()
	if st == nil {
		st = m.storageAtStart(old)
	}
	// Under the storage's locks, so that no claim of the device through another target sees it free
	// between the descriptor's end and the reservation.
	unlock, err := m.lockStorage(ctx, st)
	if err != nil {
		return nil, err
	}
	defer unlock()
	kept := proto.CloneOf(old)
	kept.UnstageTime = timestamppb.Now()
	if err := m.cfg.Store.Put(kept); err != nil {
		return nil, errdefs.NoSpace(fmt.Errorf("keep the claim on %q: %w", target, err))
	}
	m.commit(target, nil, crustv1.EventType_EVENT_TYPE_UNSTAGED, old)
	m.mu.Lock()
	m.reserveDevice(target, kept, st)
	m.mu.Unlock()
	m.log.Info("volume unstaged while claimed; its device stays reserved for the claim until it is released",
		"target", target, "sandbox", old.GetClaim().GetSandboxId())
	return old.GetClaim(), nil
}

// releaseKept ends the claim kept by k, a record of keep's: the record goes, and watchers are told of the
// release with reason and detail. The caller holds k's target lock.
func (m *Manager) releaseKept(k *crustv1.Volume, reason crustv1.ReleaseReason, detail string) error {
	target := k.GetSpec().GetVolumeTargetPath()
	if err := m.cfg.Store.Delete(target); err != nil {
		return fmt.Errorf("delete the kept claim of %q: %w", target, err)
	}
	m.commitEvent(target, nil, &crustv1.WatchVolumesResponse{Type: crustv1.EventType_EVENT_TYPE_RELEASED, Volume: k,
		ReleaseReason: reason, ReleasedClaim: k.GetClaim(), Detail: detail})
	m.unreserve(target, k)
	return nil
}

// reserveDevice records v, a record of keep's or of HoldForNode's at target, with st, what its device writes
// to; m.mu is held for writing.
func (m *Manager) reserveDevice(target string, v *crustv1.Volume, st *hostdev.Storage) {
	m.reserved[target] = v
	m.indexDevice(target, v)
	m.hold(target, st)
}

// unreserve forgets v, the record reserveDevice made at target.
func (m *Manager) unreserve(target string, v *crustv1.Volume) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.reserved, target)
	m.unindexDevice(target, v)
	m.unhold(target)
}

// keptAt returns the record of the claim kept at target, or nil.
func (m *Manager) keptAt(target string) *crustv1.Volume {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return keptOf(m.reserved[target])
}

// keptOf is v when it is a kept claim's record, else nil.
func keptOf(v *crustv1.Volume) *crustv1.Volume {
	if v.GetUnstageTime() == nil {
		return nil
	}
	return v
}

// record returns target's descriptor, or else the record of its kept claim, or nil.
func (m *Manager) record(target string) *crustv1.Volume {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.recordLocked(target)
}

// recordLocked is record; m.mu is held.
func (m *Manager) recordLocked(target string) *crustv1.Volume {
	if v := m.vols[target]; v != nil {
		return v
	}
	return keptOf(m.reserved[target])
}

// storageAtStart is what v's device writes to (storageOf), or its device number alone when that cannot
// be told any more: a device gone writes to nothing, and its number stands for it.
func (m *Manager) storageAtStart(v *crustv1.Volume) *hostdev.Storage {
	st, err := m.storageOf(v)
	if err != nil {
		m.log.Warn("cannot tell what a claimed volume's device writes to; its device number stands for it",
			"target", v.GetSpec().GetVolumeTargetPath(), "err", err)
		return hostdev.NumberStorage(v)
	}
	return st
}

// through names the target of o, a claimed volume, for a refusal: quoted, and said to be unstaged when it is
// a record of keep's.
func through(o *crustv1.Volume) string {
	if o.GetUnstageTime() != nil {
		return fmt.Sprintf("%q (unstaged, its claim kept until the sandbox releases it)", o.GetSpec().GetVolumeTargetPath())
	}
	return fmt.Sprintf("%q", o.GetSpec().GetVolumeTargetPath())
}
