package manager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/hostdev"
)

// The node is a holder like any sandbox. A caller that mounts a device's filesystem on the node itself
// (crust-csi-proxy, for a pod whose runtime shares the node's kernel) records a hold first (HoldForNode)
// and ends it once the device is unmounted there (ReleaseFromNode). A hold is a record in the store, the
// hold with a spec naming its target path, device and read_only, beside the descriptors but not one of
// them: nothing lists it but NodeHolds, no subscriber or watcher sees it, and it reserves its device, under
// all of its names, against every sandbox (oneWriter) and every deposit (unheld) until it ends. The
// node's holds never refuse each other: they share one kernel.

// HoldForNode records the node's hold h on a device, once no sandbox holds it (oneWriter): the check and
// the durable record are one step under the locks of the device's storage. A repeat with the same device
// and read_only returns the hold kept and changes nothing; another device or read_only at the same target
// is ErrAlreadyExists; a target that holds a descriptor, or a claim kept after an unstage, is
// ErrFailedPrecondition.
func (m *Manager) HoldForNode(ctx context.Context, h *crustv1.NodeHold) (*crustv1.NodeHold, error) {
	v, err := m.cfg.Validator.NodeHold(h)
	target := v.GetSpec().GetVolumeTargetPath()
	unlock, err := m.lockChecked(ctx, target, err)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if m.record(target) != nil {
		return nil, fmt.Errorf("target %q holds a volume deferred to a sandbox (or its kept claim); the node does not "+
			"mount it: %w", target, errdefs.ErrFailedPrecondition)
	}
	if old := m.nodeHoldAt(target); old != nil {
		if devOf(old.GetDeviceNumber()) != devOf(v.GetDeviceNumber()) || old.GetSpec().GetReadOnly() != v.GetSpec().GetReadOnly() {
			return nil, fmt.Errorf("the node holds %s at %q (read-only %t); asked %s (read-only %t); release it first: %w",
				old.GetResolvedBackingPath(), target, old.GetSpec().GetReadOnly(), v.GetResolvedBackingPath(),
				v.GetSpec().GetReadOnly(), errdefs.ErrAlreadyExists)
		}
		return old.GetNodeHold(), nil
	}
	st, unlockStorage, err := m.lockedStorage(ctx, v)
	if err != nil {
		return nil, err
	}
	defer unlockStorage()
	if err := m.oneWriter(v, "", st); err != nil {
		return nil, err
	}
	v.NodeHold.HoldTime = timestamppb.Now()
	if err := m.cfg.Store.Put(v); err != nil {
		return nil, errdefs.NoSpace(fmt.Errorf("store the node's hold on %q: %w", target, err))
	}
	m.mu.Lock()
	m.reserveDevice(target, v, st)
	m.mu.Unlock()
	m.log.Info("the node holds a device", "target", target, "device", v.GetResolvedBackingPath(),
		"read_only", v.GetSpec().GetReadOnly(), "pod", podName(h.GetPodNamespace(), h.GetPodName(), h.GetPodUid()))
	return v.GetNodeHold(), nil
}

// ReleaseFromNode ends the node's hold at target; a target without one is not an error.
func (m *Manager) ReleaseFromNode(ctx context.Context, target string) error {
	unlock, err := m.lockChecked(ctx, target, m.cfg.Validator.TargetName("volume_target_path", target))
	if err != nil {
		return err
	}
	defer unlock()
	return m.releaseFromNodeLocked(target)
}

// releaseFromNodeLocked is ReleaseFromNode; the caller holds target's lock.
func (m *Manager) releaseFromNodeLocked(target string) error {
	old := m.nodeHoldAt(target)
	if old == nil {
		return nil
	}
	if err := m.cfg.Store.Delete(target); err != nil {
		return fmt.Errorf("delete the node's hold on %q: %w", target, err)
	}
	m.unreserve(target, old)
	m.log.Info("the node no longer holds a device", "target", target, "device", old.GetResolvedBackingPath())
	return nil
}

// NodeHolds returns every hold of the node, ordered by target path.
func (m *Manager) NodeHolds() []*crustv1.NodeHold {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []*crustv1.NodeHold
	for _, t := range slices.Sorted(maps.Keys(m.reserved)) {
		if h := m.reserved[t].GetNodeHold(); h != nil {
			out = append(out, h)
		}
	}
	return out
}

// nodeHoldTargets returns the targets of the node's holds that start with prefix ("": all), in order.
func (m *Manager) nodeHoldTargets(prefix string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var ts []string
	for t, v := range m.reserved {
		if v.GetNodeHold() != nil && strings.HasPrefix(t, prefix) {
			ts = append(ts, t)
		}
	}
	slices.Sort(ts)
	return ts
}

// nodeHoldAt returns the record of the node's hold at target, or nil.
func (m *Manager) nodeHoldAt(target string) *crustv1.Volume {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if v := m.reserved[target]; v.GetNodeHold() != nil {
		return v
	}
	return nil
}

// holdingLocked returns what is recorded at target: a descriptor, a kept claim or a hold of the node's,
// or nil; m.mu is held.
func (m *Manager) holdingLocked(target string) *crustv1.Volume {
	if v := m.vols[target]; v != nil {
		return v
	}
	return m.reserved[target]
}

// lockedStorage is what v's device writes to (storageOf), with its bases locked (lockStorage): the caller
// holds v's target lock and calls unlock when it is done. A device the kernel no longer has is
// ErrFailedPrecondition.
func (m *Manager) lockedStorage(ctx context.Context, v *crustv1.Volume) (*hostdev.Storage, func(), error) {
	st, err := m.storageOf(v)
	if err != nil {
		kind := errdefs.ErrInternal
		if errors.Is(err, hostdev.ErrNoBlockDevice) {
			kind = errdefs.ErrFailedPrecondition
		}
		return nil, nil, fmt.Errorf("volume %q: cannot tell which devices share storage with %s: %v: %w",
			v.GetSpec().GetVolumeTargetPath(), v.GetResolvedBackingPath(), err, kind)
	}
	unlock, err := m.lockStorage(ctx, st)
	if err != nil {
		return nil, nil, err
	}
	return st, unlock, nil
}

// unheld checks that no holder but the node's own mounts (notMounted, before) keeps v, a descriptor to
// deposit, from its device: no hold of the node's at its target or on its device, and no sandbox's
// claim of the device through another target, under any of its names, unless both are read-only
// (oneWriter): a deposit a shim could not claim is refused at once, naming the holder, so that the pod
// refused learns who holds its volume from its first Event. It returns what unlocks the device's storage,
// held until the deposit is durable.
func (m *Manager) unheld(ctx context.Context, v *crustv1.Volume) (func(), error) {
	target := v.GetSpec().GetVolumeTargetPath()
	if h := m.nodeHoldAt(target); h != nil {
		return nil, fmt.Errorf("target %q is where the node mounts %s for %s; it is not deferred to a sandbox: %w",
			target, h.GetResolvedBackingPath(), podOfHold(h.GetNodeHold()), errdefs.ErrFailedPrecondition)
	}
	st, unlock, err := m.lockedStorage(ctx, v)
	if err != nil {
		return nil, err
	}
	if err := m.oneWriter(v, "", st); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// heldBy is the refusal of v (a claim, a deposit or a hold of the node's) because o, through another
// target, holds the same device, or (how, when not empty) a device that shares its storage: the node
// (o is its hold), or c's sandbox. It is an *errdefs.HeldError naming the holder's pod and runtime, and
// the remedy.
func heldBy(v, o *crustv1.Volume, c *crustv1.Claim, how string) error {
	dn := v.GetDeviceNumber()
	var who string
	if h := o.GetNodeHold(); h != nil {
		who = fmt.Sprintf("the node, which mounts it for %s (a runtime that shares the node's kernel, such as runc)",
			podOfHold(h))
	} else {
		who = fmt.Sprintf("sandbox %q of %s (%s)", c.GetSandboxId(), podOfSpec(o.GetSpec()), runtimeOf(c))
	}
	return &errdefs.HeldError{Holder: who, Message: fmt.Sprintf("device %d:%d (%s) of %q is held by %s through %s%s; a "+
		"filesystem is mounted read-write by one holder at a time (read-only users may share): wait until that pod "+
		"has ended (a Deployment's Recreate strategy, or the ReadWriteOncePod access mode, makes Kubernetes wait)",
		dn.GetMajor(), dn.GetMinor(), v.GetResolvedBackingPath(), v.GetSpec().GetVolumeTargetPath(), who, through(o), how)}
}

// runtimeOf names the runtime behind claim c.
func runtimeOf(c *crustv1.Claim) string {
	switch {
	case c.GetKata():
		return "runtime Kata Containers"
	case c.GetHandlerEndpoint() != "":
		return "the microVM runtime handler at " + c.GetHandlerEndpoint()
	}
	return "a microVM runtime"
}

// podOfSpec names the pod of a descriptor, as its metadata or pod UID says.
func podOfSpec(s *crustv1.VolumeSpec) string {
	return podName(s.GetMetadata()[volume.PodNamespaceKey], s.GetMetadata()[volume.PodNameKey], s.GetPodUid())
}

// podOfHold names the pod of a hold of the node's.
func podOfHold(h *crustv1.NodeHold) string {
	return podName(h.GetPodNamespace(), h.GetPodName(), h.GetPodUid())
}

// podName names a pod for people: "pod namespace/name", else by UID, else as unknown.
func podName(namespace, name, uid string) string {
	switch {
	case name != "":
		return "pod " + strings.TrimPrefix(namespace+"/"+name, "/")
	case uid != "":
		return "the pod with UID " + uid
	}
	return "a pod it was not told of"
}

// CheckRawDevice says why the host block device dn may not go raw into sandbox sandboxID (see crust.proto's
// CheckRawDevice), or nil: the host has it, another name of its storage or a device built on it mounted
// (HostMounts); the node holds its storage; or another sandbox holds a filesystem volume on its storage.
// Raw block volumes, and the sandbox's own volumes, are no obstacle; neither are read-only holders of a
// read-only device. It reserves nothing.
func (m *Manager) CheckRawDevice(ctx context.Context, sandboxID string, dn *crustv1.DeviceNumber, readOnly bool) error {
	if err := m.cfg.Validator.SandboxID("sandbox_id", sandboxID); err != nil {
		return err
	}
	if dn == nil || dn.GetInode() != 0 || dn.GetMajor() == 0 {
		return errdefs.Field("device", "must name a block device by major and minor (inode unset)")
	}
	name := fmt.Sprintf("/dev/block/%d:%d", dn.GetMajor(), dn.GetMinor())
	v := &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: name, VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK,
		VolumeMode: crustv1.VolumeMode_VOLUME_MODE_BLOCK, ReadOnly: readOnly}, ResolvedBackingPath: name, DeviceNumber: dn}
	if err := m.notMounted(v); err != nil {
		return err
	}
	st, unlock, err := m.lockedStorage(ctx, v)
	if err != nil {
		return err
	}
	defer unlock()
	// The holders whose storage it shares: found under m.mu, their claims asked without it.
	m.mu.RLock()
	var holders []*crustv1.Volume
	for t := range m.byDevice[devOf(dn)] {
		holders = append(holders, m.holdingLocked(t))
	}
	for _, b := range st.Bases() {
		for t := range m.byBase[b] {
			if o := m.holdingLocked(t); st.Shares(m.held[t]) {
				holders = append(holders, o)
			}
		}
	}
	m.mu.RUnlock()
	for _, o := range holders {
		if readOnly && o.GetSpec().GetReadOnly() {
			continue
		}
		if o.GetNodeHold() != nil {
			return heldBy(v, o, nil, "")
		}
		if o.GetSpec().GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
			continue // a raw volume: shared raw, as the device would be
		}
		if c := m.withFoundClaim(o).GetClaim(); c != nil && c.GetSandboxId() != sandboxID {
			return heldBy(v, o, c, "")
		}
	}
	return nil
}
