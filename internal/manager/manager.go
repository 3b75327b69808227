// Package manager is crustd's domain core: it owns the descriptors and their claims, enforces one
// writer per device, serialises operations per target path and publishes every committed change. It
// knows no runtime: what it depends on (store, validator, forwarder, subscribers, claim source) are
// interfaces it defines (deps.go), filled by the daemon's wiring.
//
// Promises:
//   - Every operation is idempotent per target path, and operations on one target are serialised by a
//     per-target lock (keylock), never by one global lock; a caller that waits too long gets ErrAborted.
//   - A change is acknowledged only after the store made it durable. The store is the commit point:
//     subscribers follow it under the target's lock, in commit order, and are rebuilt from it at start
//     (Open); a subscriber may refuse a stage before the commit, or after it, which takes the record back.
//   - A refused request (validation, conflict, a subscriber's refusal) changes nothing.
//   - No device goes to a sandbox while the host has it mounted (HostMounts): neither a stage nor a claim
//     of one succeeds.
//   - One writer per device, under any of its names (Devices): a claim of a device that shares storage with
//     one claimed through another target is refused, unless both targets are read-only.
//   - A claim made without the Runtime API (ClaimSource) counts as any other: for the one-writer rule,
//     for a Claim by another sandbox, and in every answer.
//   - One bad entry never stops the start or breaks an answer about the others: store records that
//     cannot be read are reported with what the subscribers set aside (see Problems).
//   - Watchers see the changes in the order they were made durable, each with a revision one higher than
//     the previous one; no revision is issued twice, across restarts too (Revisions), and a watch resumes
//     after a revision while the changes since are kept (WatchSince).
//   - A claim names a handler endpoint crustd can reach, or none (HandlerSockets).
//
// Errors are errdefs kinds; turning them into gRPC status is the server's job.
package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"crust.dev/crust/api/volume"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev"
	"crust.dev/crust/internal/keylock"
	"crust.dev/crust/internal/problems"
)

// Config is what the manager needs.
type Config struct {
	Validator Validator
	Store     Store
	// Subscribers follow the descriptors as they are staged and unstaged, in this order.
	Subscribers []Subscriber
	// Claims reports claims made without the Runtime API; nil: there are none.
	Claims    ClaimSource
	Forwarder Forwarder // nil: stats and expansion of a claimed volume fail with FailedPrecondition
	// Mounts says whether the host has a volume's device mounted, asked at every stage and claim; nil:
	// nothing is asked (tests of other rules).
	Mounts HostMounts
	// Devices says what a volume's device writes to, asked at every claim that is not a repeat; nil: a
	// device shares storage with itself alone (its device number, hostdev.NumberStorage).
	Devices Devices
	// Sockets says whether crustd can reach a claim's handler endpoint, asked at every claim that names
	// one; nil: nothing is asked (tests of other rules).
	Sockets HandlerSockets
	// Revisions keeps the revision counter across restarts (see Watch); nil: revisions start at zero at
	// every Open.
	Revisions Revisions
	// KubeletDir is the kubelet root; descriptors under <KubeletDir>/pods/<uid>/ are garbage-collected
	// once that pod directory is gone.
	KubeletDir string
	// LockWait bounds how long an operation waits for another one on the same target.
	LockWait time.Duration
	// WatchBuffer bounds how far a watcher may fall behind; 0 means DefaultWatchBuffer.
	WatchBuffer int
	// WatchHistory is how many of the latest events are kept for watches that resume (WatchSince); 0
	// means DefaultWatchHistory.
	WatchHistory int
	Log          *slog.Logger
}

// Manager holds the descriptors. Create it with Open.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	locks *keylock.Locker

	mu       sync.RWMutex
	vols     map[string]*crustv1.Volume    // by target path; values are never mutated, only replaced
	order    *btree.BTreeG[string]         // the keys of vols, in order, for ListPage
	byDevice map[devID]map[string]struct{} // the keys of vols, by device, for oneWriter
	// held is what the devices of the volumes with a claim of crust's write to, by target, and byBase its
	// keys by each base of that storage (hostdev.Storage.Bases), for oneWriter.
	held   map[string]*hostdev.Storage
	byBase map[string]map[string]struct{}
	// reserved are the records that are no descriptors but reserve a device, by target: the claims of
	// volumes unstaged while claimed (unstage_time set: keep) and the node's holds (node_hold set:
	// HoldForNode). They are in byDevice and held, not in vols.
	reserved map[string]*crustv1.Volume
	rev      uint64
	watchers map[*Watcher]struct{}
	revs     revisions // what is kept of rev, and what a watch resumes from
	// watchesEnded is set by EndWatches: crustd is stopping, and no watcher is kept.
	watchesEnded bool

	corrupt problems.Set // store records moved aside at start
}

// Open holds the descriptors the store kept from this boot and gives them to each subscriber (Load), with
// the target paths of the records the store dropped; the records the store moved aside are reported
// (Problems). No entry makes Open fail.
func Open(cfg Config, loaded Loaded) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.WatchBuffer <= 0 {
		cfg.WatchBuffer = DefaultWatchBuffer
	}
	if cfg.WatchHistory <= 0 {
		cfg.WatchHistory = DefaultWatchHistory
	}
	m := &Manager{
		cfg:      cfg,
		log:      cfg.Log,
		locks:    keylock.New(cfg.LockWait),
		vols:     map[string]*crustv1.Volume{},
		order:    btree.NewOrderedG[string](32),
		byDevice: map[devID]map[string]struct{}{},
		held:     map[string]*hostdev.Storage{},
		byBase:   map[string]map[string]struct{}{},
		reserved: map[string]*crustv1.Volume{},
		watchers: map[*Watcher]struct{}{},
	}
	staged := make([]*crustv1.Volume, 0, len(loaded.Volumes))
	for _, v := range loaded.Volumes {
		target := v.GetSpec().GetVolumeTargetPath()
		if v.GetUnstageTime() != nil || v.GetNodeHold() != nil { // a kept claim or a hold of the node's
			m.reserveDevice(target, v, m.storageAtStart(v))
			continue
		}
		staged = append(staged, v)
		m.set(target, v)
		if v.GetClaim() != nil {
			m.hold(target, m.storageAtStart(v))
		}
	}
	m.openRevisions()
	for _, s := range cfg.Subscribers {
		s.Load(staged, loaded.Dropped)
	}
	for _, path := range loaded.Corrupt {
		m.corrupt.Put(&crustv1.Problem{
			Kind:    crustv1.ProblemKind_PROBLEM_KIND_CORRUPT_RECORD,
			Path:    path,
			Message: "a store record could not be read and was moved aside at start; crustd no longer holds its volume",
			Remedy: "The volume's CSI driver stages it again on its next NodePublishVolume (kubelet retries it for " +
				"running pods). Inspect the file, then delete it; this report goes with it.",
		})
	}
	return m, nil
}

// Stage deposits a descriptor. The same spec again returns the stored volume and stores nothing (each
// subscriber's Restaged may redo what it could not do before); another spec for the same target is
// ErrAlreadyExists. A subscriber may refuse a new descriptor (see Subscriber): nothing is stored then. A
// device the host has mounted, or a device built on it, is ErrFailedPrecondition naming where (see
// HostMounts), the same spec again included unless a sandbox holds it: nothing is stored, and a
// descriptor already held stays.
func (m *Manager) Stage(ctx context.Context, spec *crustv1.VolumeSpec) (*crustv1.Volume, error) {
	v, err := m.cfg.Validator.Volume(spec)
	target := v.GetSpec().GetVolumeTargetPath()
	unlock, err := m.lockChecked(ctx, target, err)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if k := m.keptAt(target); k != nil {
		return nil, fmt.Errorf("volume %q was unstaged while sandbox %q held it, and its claim is kept until that "+
			"sandbox's handler releases it (at its stop) or crustd finds the handler gone; stage it again after that: %w",
			target, k.GetClaim().GetSandboxId(), errdefs.ErrFailedPrecondition)
	}
	old := m.get(target)
	if old != nil {
		if diff := differingFields(old.GetSpec(), v.GetSpec()); len(diff) > 0 {
			return nil, fmt.Errorf("volume %q is staged with other parameters (%s): %w",
				target, strings.Join(diff, ", "), errdefs.ErrAlreadyExists)
		}
		if !proto.Equal(old.GetDeviceNumber(), v.GetDeviceNumber()) {
			return nil, fmt.Errorf("volume %q is staged with device number %s but %s is now %s; unstage it first: %w",
				target, devString(old.GetDeviceNumber()), spec.GetVolumeBackingPath(), devString(v.GetDeviceNumber()),
				errdefs.ErrAlreadyExists)
		}
	}
	// A repeat of a deposit a sandbox holds changes nothing, so the device's mounts are the holder's
	// business: its claim was checked (a runtime that mounts in the host's namespace, as crust's test
	// stand-in for a VM does, would otherwise fail kubelet's repeated NodePublishVolume).
	if old == nil || m.withFoundClaim(old).GetClaim() == nil {
		// The holders first: a sandbox's mount may be on the host too (crust's test stand-in for a VM).
		unlockStorage, err := m.unheld(ctx, v)
		if err != nil {
			return nil, err
		}
		defer unlockStorage()
		if err := m.notMounted(v); err != nil {
			return nil, err
		}
	}
	if old != nil {
		for _, s := range m.cfg.Subscribers {
			if err := s.Restaged(old); err != nil {
				return nil, err
			}
		}
		return m.withFoundClaim(old), nil
	}
	for _, s := range m.cfg.Subscribers {
		if err := s.Check(v); err != nil {
			return nil, err
		}
	}
	v.StageTime = timestamppb.Now()
	if err := m.cfg.Store.Put(v); err != nil {
		return nil, errdefs.NoSpace(fmt.Errorf("store volume %q: %w", target, err))
	}
	for _, s := range m.cfg.Subscribers {
		if err := s.Staged(v); err != nil {
			// Not acknowledged, so take the record back; if that fails too, the next start gives it to
			// the subscribers again (Load).
			if derr := m.cfg.Store.Delete(target); derr != nil {
				m.log.Error("take back a record a subscriber refused", "target", target, "err", derr)
			}
			return nil, err
		}
	}
	m.commit(target, v, crustv1.EventType_EVENT_TYPE_STAGED)
	return v, nil
}

// Unstage removes a descriptor after each subscriber's Unstaging (which may refuse it: the descriptor is
// kept then). An unknown target is not an error; the subscribers are told of it all the same. The claim
// of crust's that a claimed volume carries outlives it, and is returned (see keep); so is the claim kept
// by an earlier unstage of target.
func (m *Manager) Unstage(ctx context.Context, target string) (*crustv1.Claim, error) {
	unlock, err := m.lockChecked(ctx, target, m.cfg.Validator.TargetName("volume_target_path", target))
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.unstageLocked(ctx, target)
}

func (m *Manager) unstageLocked(ctx context.Context, target string) (*crustv1.Claim, error) {
	old := m.get(target)
	// Subscribers first: a crash between them and the store leaves the record, and the next start gives
	// it to them again.
	for _, s := range m.cfg.Subscribers {
		if err := s.Unstaging(target, old); err != nil && old != nil {
			return nil, err
		}
	}
	if old == nil {
		return m.keptAt(target).GetClaim(), nil
	}
	if old.GetClaim() != nil {
		return m.keep(ctx, old)
	}
	if err := m.cfg.Store.Delete(target); err != nil {
		return nil, fmt.Errorf("delete the record of %q: %w", target, err)
	}
	m.commit(target, nil, crustv1.EventType_EVENT_TYPE_UNSTAGED, old)
	return nil, nil
}

// Get returns one descriptor, with a claim the claim source reports when it has none of crust's, or
// ErrNotFound.
func (m *Manager) Get(_ context.Context, target string) (*crustv1.Volume, error) {
	return m.stored(target)
}

// stored is Get.
func (m *Manager) stored(target string) (*crustv1.Volume, error) {
	if err := m.cfg.Validator.TargetName("volume_target_path", target); err != nil {
		return nil, err
	}
	v := m.get(target)
	if v == nil {
		return nil, notFound(target)
	}
	return m.withFoundClaim(v), nil
}

// List returns every descriptor, ordered by target path.
func (m *Manager) List(ctx context.Context) []*crustv1.Volume {
	vols, _ := m.ListPage(ctx, "", 0, 0)
	return vols
}

// ListPage returns, in target path order, the descriptors whose target path sorts after after ("" for
// the first page): at most maxEntries of them and, once it holds one, no more than maxBytes of encoded
// descriptors (zero or less: no limit), and whether more follow. The claim source is asked for the page
// only.
func (m *Manager) ListPage(_ context.Context, after string, maxEntries, maxBytes int) ([]*crustv1.Volume, bool) {
	// The candidates are taken in order under the read lock, one more than the page may hold so that
	// "more" is known; the claim source is asked, and sizes taken, outside it.
	var cands []*crustv1.Volume
	m.mu.RLock()
	m.order.AscendGreaterOrEqual(after, func(t string) bool {
		if t == after {
			return true
		}
		cands = append(cands, m.vols[t])
		return maxEntries <= 0 || len(cands) <= maxEntries
	})
	m.mu.RUnlock()
	page := make([]*crustv1.Volume, 0, len(cands))
	size := 0
	for _, v := range cands {
		v = m.withFoundClaim(v)
		n := proto.Size(v)
		if (maxEntries > 0 && len(page) == maxEntries) || (maxBytes > 0 && len(page) > 0 && size+n > maxBytes) {
			return page, true
		}
		page = append(page, v)
		size += n
	}
	return page, false
}

// Claim records that sandboxID uses the volume and returns the descriptor. The same sandbox claiming
// again succeeds (its endpoint and the claiming process, see WithClaimer, are updated); another sandbox,
// or a claim the claim source reports for another sandbox, is ErrFailedPrecondition until the claim is
// released. The device must still be the one staged, and the host must not have it mounted (see
// HostMounts), at every claim, repeats included (ErrFailedPrecondition otherwise, naming what changed or
// where it is mounted), and one writer per device holds (see oneWriter).
func (m *Manager) Claim(ctx context.Context, target, sandboxID, endpoint string) (*crustv1.Volume, error) {
	if err := errors.Join(
		m.cfg.Validator.TargetName("volume_target_path", target),
		m.cfg.Validator.SandboxID("sandbox_id", sandboxID),
		m.cfg.Validator.HandlerEndpoint("handler_endpoint", endpoint),
	); err != nil {
		return nil, err
	}
	pid, start := claimerOf(ctx)
	return m.claim(ctx, target, &crustv1.Claim{SandboxId: sandboxID, HandlerEndpoint: endpoint,
		ClaimerPid: pid, ClaimerStartTime: start}, false)
}

// ClaimFound records c, a claim found without the claimer's help (a claim source's Find), as the claim on
// target, through Claim's checks and with its event, but only when nothing claims target yet: any claim,
// the same sandbox's included, is ErrFailedPrecondition. c is recorded as given, with the claim time set.
func (m *Manager) ClaimFound(ctx context.Context, target string, c *crustv1.Claim) (*crustv1.Volume, error) {
	if err := errors.Join(
		m.cfg.Validator.TargetName("volume_target_path", target),
		m.cfg.Validator.SandboxID("claim.sandbox_id", c.GetSandboxId()),
	); err != nil {
		return nil, err
	}
	return m.claim(ctx, target, proto.CloneOf(c), true)
}

// claim is Claim and ClaimFound (found): it records c on target, setting its claim time.
func (m *Manager) claim(ctx context.Context, target string, c *crustv1.Claim, found bool) (*crustv1.Volume, error) {
	unlock, err := m.locks.Lock(ctx, target)
	if err != nil {
		return nil, err
	}
	defer unlock()

	old := m.get(target)
	if old == nil {
		return nil, notFound(target)
	}
	if held := m.withFoundClaim(old).GetClaim(); held != nil && (found || held.GetSandboxId() != c.GetSandboxId()) {
		return nil, fmt.Errorf("volume %q is claimed by sandbox %q (kata: %t); release that claim first: %w",
			target, held.GetSandboxId(), held.GetKata(), errdefs.ErrFailedPrecondition)
	}
	// The device is checked on every claim, a repeat by the same sandbox included: the path may name
	// another device since the first claim.
	if err := m.cfg.Validator.SameDevice(old); err != nil {
		return nil, fmt.Errorf("volume %q: refusing to hand out its device: %w", target, err)
	}
	if err := m.notMounted(old); err != nil {
		return nil, err
	}
	if err := m.reachable(c.GetHandlerEndpoint()); err != nil {
		return nil, fmt.Errorf("volume %q: refusing the claim of sandbox %q: %w", target, c.GetSandboxId(), err)
	}
	if o := old.GetClaim(); o != nil && o.GetHandlerEndpoint() == c.GetHandlerEndpoint() &&
		o.GetClaimerPid() == c.GetClaimerPid() && o.GetClaimerStartTime() == c.GetClaimerStartTime() {
		return old, nil
	}
	// One writer per device, whatever the path and whatever the device's name: claims of the devices that
	// share its storage, through other targets, are checked under the locks of its storage's bases (taken
	// after the target's, always in that order, the bases sorted).
	st, unlockStorage, err := m.lockedStorage(ctx, old)
	if err != nil {
		return nil, err
	}
	defer unlockStorage()
	if err := m.oneWriter(old, c.GetSandboxId(), st); err != nil {
		return nil, err
	}
	v := proto.CloneOf(old)
	c.ClaimTime = timestamppb.Now()
	v.Claim = c
	if err := m.cfg.Store.Put(v); err != nil {
		return nil, errdefs.NoSpace(fmt.Errorf("store the claim on %q: %w", target, err))
	}
	m.commit(target, v, crustv1.EventType_EVENT_TYPE_CLAIMED)
	m.mu.Lock()
	m.hold(target, st)
	m.mu.Unlock()
	return v, nil
}

// lockChecked takes target's lock, unless checkErr, the check of the request that names it, failed: it
// returns that then.
func (m *Manager) lockChecked(ctx context.Context, target string, checkErr error) (unlock func(), err error) {
	if checkErr != nil {
		return nil, checkErr
	}
	return m.locks.Lock(ctx, target)
}

// storageOf is what v's device writes to (Devices), or its device number alone without Devices.
func (m *Manager) storageOf(v *crustv1.Volume) (*hostdev.Storage, error) {
	if m.cfg.Devices == nil {
		return hostdev.NumberStorage(v), nil
	}
	return m.cfg.Devices.StorageOf(v)
}

// lockStorage takes the lock of each base of st, in order, and returns what releases them all.
func (m *Manager) lockStorage(ctx context.Context, st *hostdev.Storage) (func(), error) {
	var unlocks []func()
	release := func() {
		for _, u := range slices.Backward(unlocks) {
			u()
		}
	}
	for _, b := range st.Bases() {
		u, err := m.locks.Lock(ctx, storageKey(b))
		if err != nil {
			release()
			return nil, err
		}
		unlocks = append(unlocks, u)
	}
	return release, nil
}

// Release ends sandboxID's claim, whether crust's or one the claim source reports. An unknown or
// unclaimed volume is not an error; another sandbox's claim is ErrFailedPrecondition unless force is
// set, which releases any claim. Watchers get EVENT_TYPE_RELEASED with the claim ended.
func (m *Manager) Release(ctx context.Context, target, sandboxID string, force bool) error {
	check := m.cfg.Validator.TargetName("volume_target_path", target)
	if check == nil && (!force || sandboxID != "") {
		check = m.cfg.Validator.SandboxID("sandbox_id", sandboxID)
	}
	unlock, err := m.lockChecked(ctx, target, check)
	if err != nil {
		return err
	}
	defer unlock()

	old := m.record(target)
	if old == nil {
		return nil
	}
	if old.GetClaim() == nil {
		return m.releaseFound(old, sandboxID, force)
	}
	if holder := old.GetClaim().GetSandboxId(); holder != sandboxID && !force {
		return fmt.Errorf("volume %q is claimed by sandbox %q, not %q: %w", target, holder, sandboxID, errdefs.ErrFailedPrecondition)
	}
	return m.releaseLocked(old, releaseReason(force, sandboxID, old.GetClaim()), "")
}

// releaseFound ends, through the claim source, the claims it reports on v, which has none of crust's.
func (m *Manager) releaseFound(v *crustv1.Volume, sandboxID string, force bool) error {
	if m.cfg.Claims == nil {
		return nil
	}
	ended, err := m.cfg.Claims.Release(v, sandboxID, force)
	if err != nil || ended == nil {
		return err
	}
	m.commitEvent(v.GetSpec().GetVolumeTargetPath(), v, &crustv1.WatchVolumesResponse{Type: crustv1.EventType_EVENT_TYPE_RELEASED,
		Volume: v, ReleaseReason: releaseReason(force, sandboxID, ended), ReleasedClaim: ended})
	return nil
}

// storageKey is the lock key of a base of storage (hostdev.Storage.Bases); no target path (absolute)
// looks like it.
func storageKey(base string) string { return "storage " + base }

// devID is a device number as a map key.
type devID struct {
	major, minor uint32
	inode        uint64
}

func devOf(dn *crustv1.DeviceNumber) devID { return devID{dn.GetMajor(), dn.GetMinor(), dn.GetInode()} }

// set makes v target's volume (nil: target has none) in vols and in the indexes kept beside it; m.mu is
// held for writing.
func (m *Manager) set(target string, v *crustv1.Volume) {
	if old := m.vols[target]; old != nil {
		m.unindexDevice(target, old)
	}
	if v == nil || v.GetClaim() == nil {
		m.unhold(target)
	}
	if v == nil {
		delete(m.vols, target)
		m.order.Delete(target)
		return
	}
	m.vols[target] = v
	m.order.ReplaceOrInsert(target)
	m.indexDevice(target, v)
}

// indexDevice adds target, whose record is v, to byDevice; m.mu is held for writing.
func (m *Manager) indexDevice(target string, v *crustv1.Volume) {
	d := devOf(v.GetDeviceNumber())
	if m.byDevice[d] == nil {
		m.byDevice[d] = map[string]struct{}{}
	}
	m.byDevice[d][target] = struct{}{}
}

// unindexDevice removes target, whose record was v, from byDevice; m.mu is held for writing.
func (m *Manager) unindexDevice(target string, v *crustv1.Volume) {
	d := devOf(v.GetDeviceNumber())
	if delete(m.byDevice[d], target); len(m.byDevice[d]) == 0 {
		delete(m.byDevice, d)
	}
}

// hold records st as what the device of target, now claimed, writes to; m.mu is held for writing.
func (m *Manager) hold(target string, st *hostdev.Storage) {
	m.unhold(target)
	m.held[target] = st
	for _, b := range st.Bases() {
		if m.byBase[b] == nil {
			m.byBase[b] = map[string]struct{}{}
		}
		m.byBase[b][target] = struct{}{}
	}
}

// unhold forgets what the device of target writes to (hold); m.mu is held for writing.
func (m *Manager) unhold(target string) {
	st := m.held[target]
	if st == nil {
		return
	}
	delete(m.held, target)
	for _, b := range st.Bases() {
		if delete(m.byBase[b], target); len(m.byBase[b]) == 0 {
			delete(m.byBase, b)
		}
	}
}

// oneWriter refuses (ErrFailedPrecondition, naming the holder: heldBy) v, a claim by sandboxID, a deposit
// (sandboxID "") or a hold of the node's, while the same device is held through another target path and
// either target is read-write, whoever holds the other: two kernels mounting one filesystem read-write, or
// one writing under another's read-only mount, corrupt it; and a handler attaches each target as a disk of
// its own, so one sandbox holding two targets of a device would mount it twice through two disks its
// kernel takes for different ones. The holders are the sandboxes (their claims, kept ones and Kata's
// included) and the node (its holds, which never refuse each other: one kernel). Read-only targets share
// a device, in one sandbox or several. One sandbox that uses one volume at several places claims one
// target and mounts it at each. A device's other names, which share its storage st, count as the device
// (noOtherName).
func (m *Manager) oneWriter(v *crustv1.Volume, sandboxID string, st *hostdev.Storage) error {
	dn := v.GetDeviceNumber()
	m.mu.RLock()
	var same []*crustv1.Volume
	for t := range m.byDevice[devOf(dn)] {
		o := m.holdingLocked(t)
		// Read-only targets share a device whoever holds them, so their claims are not looked up.
		bothReadOnly := v.GetSpec().GetReadOnly() && o.GetSpec().GetReadOnly()
		bothNode := v.GetNodeHold() != nil && o.GetNodeHold() != nil
		if t != v.GetSpec().GetVolumeTargetPath() && !bothReadOnly && !bothNode {
			same = append(same, o)
		}
	}
	m.mu.RUnlock()
	for _, o := range same {
		if o.GetNodeHold() != nil {
			return heldBy(v, o, nil, "")
		}
		c := m.withFoundClaim(o).GetClaim()
		if c == nil {
			continue
		}
		if sandboxID != "" && c.GetSandboxId() == sandboxID {
			return fmt.Errorf("device %d:%d of volume %q is already used by sandbox %q through %s; one sandbox may "+
				"use a device through several targets only when all are read-only (each target is attached as a "+
				"disk of its own); to use one volume at several places, claim one target and mount it at each: %w",
				dn.GetMajor(), dn.GetMinor(), v.GetSpec().GetVolumeTargetPath(), sandboxID, through(o),
				errdefs.ErrFailedPrecondition)
		}
		return heldBy(v, o, c, "")
	}
	return m.noOtherName(v, st)
}

// noOtherName is oneWriter for the other devices that share v's storage st (its other names): it refuses
// v while one of them is held, by any sandbox or by the node, through another target, unless both
// targets are read-only (or both are the node's). It sees the claims of crust's and the node's holds
// (held); a claim only the claim source reports is seen on the same device number alone.
func (m *Manager) noOtherName(v *crustv1.Volume, st *hostdev.Storage) error {
	target := v.GetSpec().GetVolumeTargetPath()
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, b := range st.Bases() {
		for t := range m.byBase[b] {
			o := m.holdingLocked(t)
			if t == target || o == nil || devOf(o.GetDeviceNumber()) == devOf(v.GetDeviceNumber()) ||
				(v.GetSpec().GetReadOnly() && o.GetSpec().GetReadOnly()) ||
				(v.GetNodeHold() != nil && o.GetNodeHold() != nil) || !st.Shares(m.held[t]) {
				continue
			}
			return heldBy(v, o, o.GetClaim(), fmt.Sprintf(" (%s, named %s there, writes to storage it writes to too: %v; "+
				"loop devices over one file, a partition and its disk, a device-mapper or md device and the devices "+
				"under it are one device)", v.GetResolvedBackingPath(), o.GetResolvedBackingPath(), m.held[t]))
		}
	}
	return nil
}

// NotMountedMessage is the volume condition's message in the stats of a volume no sandbox holds yet.
const NotMountedMessage = "not yet mounted in a sandbox: the total is the device's size; used and available are " +
	"measured once a sandbox mounts the volume"

// NotAttachedRawMessage is NotMountedMessage for a raw block volume, which has no usage to measure.
const NotAttachedRawMessage = "raw block volume not yet attached to a sandbox: the total is the device's size"

// Stats asks the claiming sandbox's handler for the volume's usage. For a volume nothing claims the claim
// source is asked first (ClaimSource.Find). Before any sandbox claims the volume
// it answers from the host: the device's size as the total bytes, used and available unknown (zero), no
// inode entry, and a condition, not abnormal, that says so (NotMountedMessage, NotAttachedRawMessage for
// a raw block volume). A device that is no longer the one staged is ErrFailedPrecondition.
func (m *Manager) Stats(ctx context.Context, target string) (*crustv1.GetVolumeStatsResponse, error) {
	v, err := m.stored(target)
	if err != nil {
		return nil, err
	}
	if v.GetClaim() == nil {
		if found := m.find(ctx, target); found != nil {
			v = found
		}
	}
	if v.GetClaim() == nil {
		size, err := m.unclaimedDevice(v, hostdev.Size)
		if err != nil {
			return nil, err
		}
		msg := NotMountedMessage
		if v.GetSpec().GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
			msg = NotAttachedRawMessage
		}
		return &crustv1.GetVolumeStatsResponse{
			Usage:           []*crustv1.VolumeUsage{{Unit: crustv1.VolumeUsage_UNIT_BYTES, Total: size}},
			VolumeCondition: &crustv1.VolumeCondition{Message: msg},
		}, nil
	}
	if err := m.forwarding(v); err != nil {
		return nil, err
	}
	return m.cfg.Forwarder.Stats(ctx, v)
}

// Expand grows the volume to at least requiredBytes (and at most limitBytes when that is not zero) and
// returns its capacity. A persistent-memory volume cannot grow: ErrUnimplemented, claimed or not, and
// nothing is changed. The claiming sandbox's handler grows it online; for a volume nothing claims the
// claim source is asked first (ClaimSource.Find). Before any sandbox claims the
// volume, Expand makes the host see the device's current size, records requiredBytes durably as the
// volume's requested_bytes (the largest asked for is kept; watchers get EVENT_TYPE_EXPANDED when it
// grows) and returns the device's size: the handler that claims the volume grows the filesystem when it
// mounts it. A device smaller than requiredBytes is ErrFailedPrecondition and changes nothing.
func (m *Manager) Expand(ctx context.Context, target string, requiredBytes, limitBytes int64) (int64, error) {
	if requiredBytes <= 0 {
		return 0, errdefs.Field("required_bytes", "must be positive, got %d", requiredBytes)
	}
	if limitBytes < 0 || (limitBytes > 0 && limitBytes < requiredBytes) {
		return 0, errdefs.Field("limit_bytes", "must be zero (no limit) or at least required_bytes %d, got %d", requiredBytes, limitBytes)
	}
	m.find(ctx, target) // before the lock: the claim source asks its runtime without holding it
	unlock, err := m.locks.Lock(ctx, target)
	if err != nil {
		return 0, err
	}
	defer unlock()
	v, err := m.stored(target)
	if err != nil {
		return 0, err
	}
	if v.GetSpec().GetVolumeType() == crustv1.VolumeType_VOLUME_TYPE_PMEM {
		return 0, fmt.Errorf("volume %q is persistent memory (VOLUME_TYPE_PMEM), which cannot be expanded: a microVM "+
			"maps it into guest memory at its size and cannot resize the mapping; create a larger volume and copy the "+
			"data instead: %w", target, errdefs.ErrUnimplemented)
	}
	// The host's view first: a loop device learns that its backing file grew only when told.
	var deviceBytes int64
	claimed := v.GetClaim() != nil
	if claimed {
		if err := m.forwarding(v); err != nil {
			return 0, err
		}
		deviceBytes, err = hostdev.Refresh(v.GetResolvedBackingPath(), v.GetSpec().GetVolumeType())
	} else {
		deviceBytes, err = m.unclaimedDevice(v, hostdev.Refresh)
	}
	if err != nil {
		return 0, err
	}
	if deviceBytes < requiredBytes {
		return 0, fmt.Errorf("volume %q: its device %s holds %d bytes, less than the %d asked for; grow the backing volume first (ControllerExpandVolume): %w",
			target, v.GetResolvedBackingPath(), deviceBytes, requiredBytes, errdefs.ErrFailedPrecondition)
	}
	capacity := deviceBytes
	if claimed {
		capacity, err = m.cfg.Forwarder.Expand(ctx, v, requiredBytes, deviceBytes)
	} else {
		err = m.recordRequested(v, requiredBytes)
	}
	if err != nil {
		return 0, err
	}
	if limitBytes > 0 && capacity > limitBytes {
		m.log.Warn("volume grew past limit_bytes", "target", target, "capacity", capacity, "limit", limitBytes)
	}
	return capacity, nil
}

// recordRequested makes requiredBytes the requested_bytes of v (a stored volume without a claim), durably,
// unless it already asks as much. The caller holds v's target lock.
func (m *Manager) recordRequested(v *crustv1.Volume, requiredBytes int64) error {
	target := v.GetSpec().GetVolumeTargetPath()
	if v.GetRequestedBytes() >= requiredBytes {
		return nil
	}
	nv := proto.CloneOf(v)
	nv.RequestedBytes = requiredBytes
	if err := m.cfg.Store.Put(nv); err != nil {
		return errdefs.NoSpace(fmt.Errorf("store the requested size of %q: %w", target, err))
	}
	m.commit(target, nv, crustv1.EventType_EVENT_TYPE_EXPANDED)
	next := "the handler grows the filesystem when it mounts"
	if v.GetSpec().GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
		next = "the sandbox sees the device at its new size when it is attached"
	}
	m.log.Info("expansion before any claim recorded; "+next, "target", target, "requested_bytes", requiredBytes)
	return nil
}

// unclaimedDevice checks that v's device is still the one staged and returns its size as measure finds it
// (hostdev.Size, or hostdev.Refresh to make the host see a grown backing first).
func (m *Manager) unclaimedDevice(v *crustv1.Volume, measure func(string, crustv1.VolumeType) (int64, error)) (int64, error) {
	if err := m.cfg.Validator.SameDevice(v); err != nil {
		return 0, fmt.Errorf("volume %q: %w", v.GetSpec().GetVolumeTargetPath(), err)
	}
	return measure(v.GetResolvedBackingPath(), v.GetSpec().GetVolumeType())
}

// notMounted says why v's device may not go to a sandbox because the host has it mounted (HostMounts), or
// nil.
func (m *Manager) notMounted(v *crustv1.Volume) error {
	if m.cfg.Mounts == nil {
		return nil
	}
	if err := m.cfg.Mounts.NotMounted(v); err != nil {
		return fmt.Errorf("volume %q: refusing its device: %w", v.GetSpec().GetVolumeTargetPath(), err)
	}
	return nil
}

// reachable says why crustd cannot reach the handler endpoint ep (HandlerSockets), or nil; "" is nil.
func (m *Manager) reachable(ep string) error {
	if m.cfg.Sockets == nil || ep == "" {
		return nil
	}
	return m.cfg.Sockets.Reachable(ep)
}

// forwarding says why stats and expansion of the claimed volume v cannot be forwarded, or nil.
func (m *Manager) forwarding(v *crustv1.Volume) error {
	if m.cfg.Forwarder == nil {
		return fmt.Errorf("volume %q: this crustd forwards to no runtime handler: %w", v.GetSpec().GetVolumeTargetPath(), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// CollectGarbage unstages the descriptors of pods whose kubelet pod directory is gone, and ends the
// node's holds at their targets (kubelet removes a pod's directory only once its volumes are unmounted),
// and returns their target paths, descriptors first, each in order: of every pod, or only of the pods podUIDs names (their directories' names
// under <KubeletDir>/pods), which costs the descriptors of those pods alone. It does nothing when
// <KubeletDir>/pods does not exist (no kubelet on this node yet). A pass reads no volume's claim and
// looks at each pod's directory once.
func (m *Manager) CollectGarbage(ctx context.Context, podUIDs ...string) []string {
	pods := filepath.Join(m.cfg.KubeletDir, "pods")
	if _, err := os.Stat(pods); err != nil {
		return nil
	}
	var targets []string
	if len(podUIDs) == 0 {
		targets = append(m.targets(), m.nodeHoldTargets("")...)
	}
	for _, uid := range slices.Compact(slices.Sorted(slices.Values(podUIDs))) {
		targets = append(targets, m.targetsUnder(filepath.Join(pods, uid)+"/")...)
		targets = append(targets, m.nodeHoldTargets(filepath.Join(pods, uid)+"/")...)
	}
	var gone []string
	podGone := map[string]bool{} // a pod's directory is looked at once a pass, however many volumes it has
	for _, target := range targets {
		uid := volume.PodDirUID(m.cfg.KubeletDir, target)
		if uid == "" {
			continue
		}
		g, seen := podGone[uid]
		if !seen {
			_, err := os.Lstat(filepath.Join(pods, uid))
			g = errors.Is(err, os.ErrNotExist)
			podGone[uid] = g
		}
		if !g {
			continue
		}
		unlock, err := m.locks.Lock(ctx, target)
		if err != nil {
			continue // busy: the next pass gets it
		}
		if m.nodeHoldAt(target) != nil {
			err = m.releaseFromNodeLocked(target)
		} else {
			_, err = m.unstageLocked(ctx, target)
		}
		if err != nil {
			m.log.Error("garbage-collect a volume of a deleted pod", "target", target, "err", err)
		} else {
			m.log.Info("garbage-collected the volume of a deleted pod", "target", target, "pod_uid", uid)
			gone = append(gone, target)
		}
		unlock()
	}
	return gone
}

// targetsUnder returns the target paths of the descriptors held that start with prefix, in order.
func (m *Manager) targetsUnder(prefix string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var ts []string
	m.order.AscendGreaterOrEqual(prefix, func(t string) bool {
		if !strings.HasPrefix(t, prefix) {
			return false
		}
		ts = append(ts, t)
		return true
	})
	return ts
}

// targets returns the target paths of the descriptors held, in order. Nothing else is asked: the
// claim source is not.
func (m *Manager) targets() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	ts := make([]string, 0, len(m.vols))
	m.order.Ascend(func(t string) bool {
		ts = append(ts, t)
		return true
	})
	return ts
}

// Counts returns how many volumes are staged and how many of them are claimed; for metrics.
func (m *Manager) Counts() (staged, claimed int) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, v := range m.vols {
		if v.GetClaim() != nil {
			claimed++
		}
	}
	return len(m.vols), claimed
}

func (m *Manager) get(target string) *crustv1.Volume {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.vols[target]
}

// Held returns the descriptor at target as stored (its claim crust's, if any), or nil. It takes no lock
// and checks nothing: for the parts that follow the manager (a claim source, a subscriber).
func (m *Manager) Held(target string) *crustv1.Volume { return m.get(target) }

// AllHeld returns every descriptor as stored, in no particular order (see Held).
func (m *Manager) AllHeld() []*crustv1.Volume {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Collect(maps.Values(m.vols))
}

// Locked calls fn with the descriptor at target as stored (nil when none) under the target's lock, so
// that no operation on target runs meanwhile. It is ErrAborted when the lock is not had in time.
func (m *Manager) Locked(ctx context.Context, target string, fn func(held *crustv1.Volume)) error {
	unlock, err := m.locks.Lock(ctx, target)
	if err != nil {
		return err
	}
	defer unlock()
	fn(m.get(target))
	return nil
}

// PodUID is the UID of v's pod: the one whose kubelet directory holds v's target
// (<kubelet>/pods/<uid>/...), else the spec's pod_uid (validation made sure the two agree), else "".
func (m *Manager) PodUID(v *crustv1.Volume) string {
	if uid := volume.PodDirUID(m.cfg.KubeletDir, v.GetSpec().GetVolumeTargetPath()); uid != "" {
		return uid
	}
	return v.GetSpec().GetPodUid()
}

// withFoundClaim returns v, or a copy carrying the claim the claim source reports when v has no claim of
// its own.
func (m *Manager) withFoundClaim(v *crustv1.Volume) *crustv1.Volume {
	if v.GetClaim() != nil || m.cfg.Claims == nil {
		return v
	}
	c := m.cfg.Claims.Claim(v)
	if c == nil {
		return v
	}
	out := proto.CloneOf(v)
	out.Claim = c
	return out
}

// find asks the claim source for the claimer of the unclaimed volume at target (ClaimSource.Find).
func (m *Manager) find(ctx context.Context, target string) *crustv1.Volume {
	if m.cfg.Claims == nil {
		return nil
	}
	return m.cfg.Claims.Find(ctx, target)
}

// commit makes an acknowledged change visible: the in-memory map and the watchers, in one step so that
// watchers see changes in revision order. v == nil removes target; the event then carries before[0].
func (m *Manager) commit(target string, v *crustv1.Volume, typ crustv1.EventType, before ...*crustv1.Volume) {
	ev := &crustv1.WatchVolumesResponse{Type: typ, Volume: v}
	if v == nil {
		ev.Volume = before[0]
	}
	m.commitEvent(target, v, ev)
}

// commitEvent is commit with an event of the caller's making; its revision is set here.
func (m *Manager) commitEvent(target string, v *crustv1.Volume, ev *crustv1.WatchVolumesResponse) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.set(target, v)
	m.rev++
	m.keepRevision()
	ev.Revision = m.rev
	m.remember(ev)
	m.broadcast(ev)
}

func notFound(target string) error {
	return fmt.Errorf("no volume is staged at %q: %w", target, errdefs.ErrNotFound)
}

func devString(d *crustv1.DeviceNumber) string {
	if d.GetInode() != 0 {
		return fmt.Sprintf("%d:%d inode %d", d.GetMajor(), d.GetMinor(), d.GetInode())
	}
	return fmt.Sprintf("%d:%d", d.GetMajor(), d.GetMinor())
}

// differingFields names the top-level spec fields that differ, for an AlreadyExists message.
func differingFields(a, b *crustv1.VolumeSpec) []string {
	var diff []string
	fields := a.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if !fieldEqual(a.ProtoReflect(), b.ProtoReflect(), f) {
			diff = append(diff, string(f.Name()))
		}
	}
	return diff
}

func fieldEqual(a, b protoreflect.Message, f protoreflect.FieldDescriptor) bool {
	if a.Has(f) != b.Has(f) {
		return false
	}
	// Compare through single-field messages so that lists and maps use proto's equality.
	x, y := a.New(), b.New()
	if a.Has(f) {
		x.Set(f, a.Get(f))
		y.Set(f, b.Get(f))
	}
	return proto.Equal(x.Interface(), y.Interface())
}
