package csiproxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/pkg/fsgroup"
)

// undoTimeout bounds the undo of a publish that failed with a final code.
const undoTimeout = 2 * time.Minute

// NodeStageVolume stages a deferrable volume (mount capability, crust.dev/defer: "true") as raw block
// and records it; everything else is forwarded unchanged. A deferrable volume whose I/O limits crustd
// would refuse, or whose access mode lets several nodes write (checkAccessMode: a static PV, or one
// provisioned before the controller proxy, reaches the node without CreateVolume), is refused with
// InvalidArgument naming the field, before anything is done.
func (p *Proxy) NodeStageVolume(ctx context.Context, r *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	path := r.GetStagingTargetPath()
	volCtx := p.volumeContext(ctx, r.GetVolumeContext(), r.GetVolumeId())
	if !isMount(r.GetVolumeCapability()) || !DeferRequested(volCtx) || r.GetVolumeId() == "" || path == "" {
		// The group, when the driver cannot take it, is given at publish (forwardPublish).
		gid, gidErr := mountGroup(r.GetVolumeCapability())
		c, gid, err := p.withoutMountGroup(ctx, r.GetVolumeCapability(), gid, gidErr)
		if err != nil {
			return nil, err
		}
		if gid != nil {
			r = proto.Clone(r).(*csi.NodeStageVolumeRequest)
			r.VolumeCapability = c
			return p.node.NodeStageVolume(outgoing(ctx), r)
		}
		resp := &csi.NodeStageVolumeResponse{}
		if err := p.forwardAsIs(ctx, csi.Node_NodeStageVolume_FullMethodName, r, resp); err != nil {
			return nil, err
		}
		return resp, nil
	}
	if err := checkAccessMode("volume_capability", r.GetVolumeCapability()); err != nil {
		return nil, err
	}
	prev, unlock, err := p.lockToChange(ctx, KindStage, path, volCtx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	key, err := stageKey(volCtx, r.GetSecrets())
	if err != nil {
		return nil, err
	}
	rec := &Record{Kind: KindStage, Path: path, VolumeID: r.GetVolumeId(), Mode: ModeBlockStage}
	if err := p.put(rec, PhaseStaging); err != nil {
		return nil, err
	}
	br := proto.Clone(r).(*csi.NodeStageVolumeRequest)
	br.VolumeCapability = blockCapability(r.GetVolumeCapability())
	resp, err := p.node.NodeStageVolume(outgoing(ctx), br)
	if err != nil {
		if isFinal(err) && (prev == nil || prev.Phase != PhaseStaged) {
			if derr := p.journal.Delete(KindStage, path); derr != nil {
				p.log.Error("forget a failed stage", "path", path, "err", derr)
			}
		}
		return nil, err
	}
	if err := p.put(rec, PhaseStaged); err != nil {
		return nil, err
	}
	if key != "" {
		if err := p.stageKeys.set(path, key); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
		}
	}
	return resp, nil
}

// NodeUnstageVolume forwards to the driver and, for a path the proxy staged as raw block, forgets it
// once the driver has unstaged.
func (p *Proxy) NodeUnstageVolume(ctx context.Context, r *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	path := r.GetStagingTargetPath()
	forward := func() (*csi.NodeUnstageVolumeResponse, error) { return p.node.NodeUnstageVolume(outgoing(ctx), r) }
	return undo(ctx, p, KindStage, r.GetVolumeId(), path, forward, func(rec *Record) (*csi.NodeUnstageVolumeResponse, error) {
		if err := p.put(rec, PhaseUnstaging); err != nil {
			return nil, err
		}
		resp, err := forward()
		if err != nil {
			return nil, err
		}
		if err := p.stageKeys.forget(path); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
		}
		if err := p.journal.Delete(KindStage, path); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "forget stage of %s: %v", path, err)
		}
		return resp, nil
	})
}

// lockToChange locks the record of kind at path for a call that may change it, once the I/O limits of
// the volume context are found acceptable: I/O limits or encryption keys crustd or the descriptor would
// refuse are refused before anything is done.
func (p *Proxy) lockToChange(ctx context.Context, kind Kind, path string, volCtx map[string]string) (*Record, func(), error) {
	if err := checkParameters(volCtx); err != nil {
		return nil, nil, err
	}
	return p.lockRecord(ctx, kind, path)
}

// undo runs fn on the record of kind at path, locked. A request that names no volume or no path, or a
// path the proxy keeps no record of (before the lock or once it is held), is the driver's: forward.
func undo[R any](ctx context.Context, p *Proxy, kind Kind, volumeID, path string, forward func() (R, error), fn func(*Record) (R, error)) (R, error) {
	if volumeID == "" || path == "" || p.journal.Get(kind, path) == nil {
		return forward()
	}
	rec, unlock, err := p.lockRecord(ctx, kind, path)
	if err != nil {
		var none R
		return none, err
	}
	defer unlock()
	if rec == nil {
		return forward()
	}
	return fn(rec)
}

// NodePublishVolume decides (see Decide) and either forwards, or publishes deferred or host-mounted. A
// volume it would defer or host-mount whose I/O limits crustd would refuse, or whose access mode lets
// several nodes write (checkAccessMode), is refused with InvalidArgument naming the field, before
// anything is done.
func (p *Proxy) NodePublishVolume(ctx context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	pr := p.newPublishRequest(ctx, r)
	target := r.GetTargetPath()
	held := p.journal.Get(KindPublish, target) != nil
	if pr.deferAsked && pr.block && !held {
		// A raw block volume of a class that defers: never deferred, whatever the pod (Decide).
		p.decided(pr, client.PassThrough, client.ReasonRawBlock)
		return p.forwardPublish(ctx, pr)
	}
	if r.GetVolumeId() == "" || target == "" || r.GetVolumeCapability() == nil ||
		((!pr.mount || !pr.deferAsked) && !held) {
		return p.forwardPublish(ctx, pr)
	}
	if err := checkAccessMode("volume_capability", r.GetVolumeCapability()); err != nil {
		return nil, err
	}
	rec, unlock, err := p.lockToChange(ctx, KindPublish, target, pr.volumeContext())
	if err != nil {
		return nil, err
	}
	defer unlock()
	why := "" // set when this call decides
	if rec == nil {
		stage := p.journal.Get(KindStage, r.GetStagingTargetPath())
		d, reason, err := Decide(ctx, DecideInput{
			Capability: r.GetVolumeCapability(), VolumeContext: pr.volumeContext(),
			StagingPath: r.GetStagingTargetPath(), StagedAsBlock: stage != nil && stage.Phase == PhaseStaged && !stage.Stale,
			Deferral: p.deferral,
		})
		if err != nil {
			return nil, err
		}
		why = reason
		p.decided(pr, d, why)
		if d == client.PassThrough {
			return p.forwardPublish(ctx, pr)
		}
		mode := ModeDeferred
		if d == client.HostMount {
			mode = ModeHost
		}
		rec = &Record{Kind: KindPublish, Path: target, VolumeID: r.GetVolumeId(), Mode: mode}
	} else if rec.VolumeID != r.GetVolumeId() {
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "%s is published for volume %s, not %s", target, rec.VolumeID, r.GetVolumeId())
	} else if rec.Phase == PhasePublished && !rec.Stale && (rec.ReadOnly != pr.readOnly || rec.FsType != pr.fsType) {
		return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "%s is published %s, read-only %v; asked %s, read-only %v",
			target, rec.FsType, rec.ReadOnly, pr.fsType, pr.readOnly)
	}
	caveats, err := p.publish(ctx, pr, rec)
	switch {
	case errors.As(err, new(*errdefs.HeldError)):
		// Not the runtime's failure, nor crust's: another pod holds the volume, and the message names it
		// and the remedy.
		p.metrics.PublishFailed(string(rec.Mode))
		p.podEvent(pr.pod, corev1.EventTypeWarning, ReasonHeld, "volume %s: %v", r.GetVolumeId(), err)
	case err != nil:
		p.metrics.PublishFailed(string(rec.Mode))
		verb := "deferring it to the pod's sandbox"
		if rec.Mode == ModeHost {
			verb = "mounting it on the host"
		}
		p.podEvent(pr.pod, corev1.EventTypeWarning, ReasonDeferralFailed, "volume %s: %s failed (%v): %v",
			r.GetVolumeId(), verb, errdefs.KindOf(err), err)
	case why != "" && rec.Mode == ModeDeferred:
		p.podEvent(pr.pod, corev1.EventTypeNormal, ReasonDeferred,
			"volume %s deferred to the pod's sandbox (%s): crustd holds device %s for the microVM runtime to mount inside the VM%s",
			r.GetVolumeId(), why, rec.Device, kataCaveats(caveats))
	case why != "" && rec.Mode == ModeHost:
		p.podEvent(pr.pod, corev1.EventTypeNormal, ReasonHostMounted,
			"volume %s formatted and mounted on the host by crust-csi-proxy, not deferred: %s", r.GetVolumeId(), why)
	}
	if err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// decided logs and counts the decision taken on a publish.
func (p *Proxy) decided(pr *publishRequest, d client.Decision, why string) {
	mode := "filesystem"
	if pr.block {
		mode = "block"
	}
	p.log.Info("publish decision", "target", pr.sent.GetTargetPath(), "volume_id", pr.sent.GetVolumeId(), "volume_mode", mode,
		"decision", d.String(), "why", why)
	p.metrics.PublishDecision(d.String(), mode)
}

// forwardPublish forwards a publish to the driver; when the driver cannot take volume_mount_group the
// proxy keeps it from the driver and gives the published filesystem the group itself, as kubelet does.
func (p *Proxy) forwardPublish(ctx context.Context, pr *publishRequest) (*csi.NodePublishVolumeResponse, error) {
	r := pr.sent
	c, gid, err := p.withoutMountGroup(ctx, r.GetVolumeCapability(), pr.gid, pr.gidErr)
	if err != nil {
		return nil, err
	}
	if gid == nil {
		resp := &csi.NodePublishVolumeResponse{}
		if err := p.forwardAsIs(ctx, csi.Node_NodePublishVolume_FullMethodName, r, resp); err != nil {
			return nil, err
		}
		return resp, nil
	}
	fr := proto.CloneOf(r)
	fr.VolumeCapability = c
	resp, err := p.node.NodePublishVolume(outgoing(ctx), fr)
	if err != nil || pr.readOnly {
		return resp, err
	}
	if err := fsgroup.Apply(r.GetTargetPath(), int(*gid), p.groupPolicy(pr.pod)); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "apply volume_mount_group %d to %s: %v", *gid, r.GetTargetPath(), err)
	}
	return resp, nil
}

// deferRequested reports whether a volume asks for deferral (DeferRequested of volumeContext).
func (p *Proxy) deferRequested(ctx context.Context, volCtx map[string]string, volumeID string) bool {
	return DeferRequested(p.volumeContext(ctx, volCtx, volumeID))
}

// volumeContext is what the proxy reads crust's keys (crust.dev/defer and the I/O limits) from: the
// volume context as it came, when that holds crust.dev/defer (put there by the controller proxy or the
// driver, or a CSI inline volume's attributes); otherwise that context with crust's keys added from the
// parameters of the StorageClass of its PersistentVolume, found by the driver's name and the volume id in
// the informer cache (a static PV, or one provisioned before the controller proxy was added), where the
// context lacks them. The caller's map is not modified.
func (p *Proxy) volumeContext(ctx context.Context, volCtx map[string]string, volumeID string) map[string]string {
	if _, ok := volCtx[DeferKey]; ok || p.classes == nil || volumeID == "" {
		return volCtx
	}
	params, found := p.classes.ClassParameters(p.driverNameFor(ctx), volumeID)
	if !found {
		return volCtx
	}
	out := maps.Clone(volCtx)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range params {
		if _, given := out[k]; !given && volume.IsParameterKey(k) {
			out[k] = v
		}
	}
	return out
}

// publish runs every step of a deferred or host-mounted publish of pr into rec; each is idempotent, so a
// retry after a crash runs them all again. A deferred volume's descriptor is built by api/client from
// pr's enriched request. It returns the Kata caveats crustd answered for a deferred volume (none for a
// host mount).
func (p *Proxy) publish(ctx context.Context, pr *publishRequest, rec *Record) (kataCaveats []string, err error) {
	r := pr.sent
	target := r.GetTargetPath()
	if pr.gidErr != nil {
		return nil, pr.gidErr
	}
	// A repeat of a publish that completed must not tear it down when it fails (say, with ALREADY_EXISTS
	// for other parameters): it stays published, as it was.
	wasPublished := rec.Phase == PhasePublished && !rec.Stale
	rec.StagingPath = r.GetStagingTargetPath()
	rec.PrivatePath = p.privatePath(target)
	rec.FsType = pr.fsType
	rec.ReadOnly = pr.readOnly
	if err := p.put(rec, PhasePublishing); err != nil {
		return nil, err
	}
	fail := func(err error) ([]string, error) {
		if wasPublished {
			if perr := p.put(rec, PhasePublished); perr != nil {
				p.log.Error("restore a published record", "target", target, "err", perr)
			}
			return nil, err
		}
		if !isFinal(err) {
			return nil, err // kubelet keeps the volume as uncertain: it retries or unpublishes
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		if uerr := p.undoPublish(uctx, rec); uerr != nil {
			p.log.Error("undo a failed publish", "target", target, "err", uerr)
			return nil, errdefs.Errorf(errdefs.ErrAborted, "%v (and undoing what was done failed: %v; retry)",
				err, uerr)
		}
		return nil, err
	}

	if err := os.MkdirAll(filepath.Dir(rec.PrivatePath), 0o700); err != nil {
		return fail(errdefs.Errorf(errdefs.ErrInternal, "private path: %v", err))
	}
	br := proto.CloneOf(r)
	br.TargetPath = rec.PrivatePath
	br.VolumeCapability = blockCapability(r.GetVolumeCapability())
	if _, err := p.node.NodePublishVolume(outgoing(ctx), br); err != nil {
		return fail(err)
	}
	dev, err := resolveDevice(rec.PrivatePath)
	if err != nil {
		return fail(errdefs.Errorf(errdefs.ErrInternal, "the driver's raw block publish at %s: %v", rec.PrivatePath, err))
	}
	rec.Device = dev
	if err := os.Mkdir(target, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return fail(errdefs.Errorf(errdefs.ErrInternal, "create target path: %v", err))
	}
	policy := p.groupPolicy(pr.pod)
	switch rec.Mode {
	case ModeDeferred:
		v, err := p.crust.Stage(ctx, pr.req, dev, p.publishOptions(ctx, policy)...)
		if err != nil {
			return fail(fmt.Errorf("crustd: %w", err))
		}
		kataCaveats = v.GetKataCaveats()
		if err := p.guard(pr.pod, target); err != nil {
			return fail(err)
		}
	case ModeHost:
		if err := p.holdForNode(ctx, rec, pr.pod); err != nil {
			return fail(err)
		}
		if err := p.hostMount(rec, pr.mountFlags, pr.gid, policy); err != nil {
			return fail(err)
		}
	}
	if err := p.put(rec, PhasePublished); err != nil {
		return fail(err)
	}
	return kataCaveats, nil
}

// privateBlockDir names the proxy's directory beside kubelet's files in a pod's CSI volume directory
// (kubelet keeps mount and vol_data.json there; it never makes a name with "crust.dev").
const privateBlockDir = "crust.dev~block"

// privatePath is where the driver publishes a deferred or host-mounted volume as a raw block device. For
// a target of kubelet's shape, <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount, it is
// <name>/crust.dev~block/dev, beside the target, so that a driver that sees only <kubelet>/pods sees it
// too; it is removed at unpublish, before kubelet removes the volume's directory. For any other target
// (csi-sanity's, say) it lies under the state directory.
func (p *Proxy) privatePath(target string) string {
	if _, ok := volume.ParseTargetPath(target); ok {
		return filepath.Join(filepath.Dir(target), privateBlockDir, "dev")
	}
	return filepath.Join(p.journal.PrivateDir(target), "dev")
}

// publishOptions are what the proxy asks of every descriptor it deposits, beyond what the request says:
// a blank device is formatted in the guest, the descriptor names the driver, and the fsGroup, if any, is
// applied under policy, the pod's (groupPolicy).
func (p *Proxy) publishOptions(ctx context.Context, policy fsgroup.Policy) []client.PublishOption {
	opts := []client.PublishOption{client.CreateFilesystem(), client.DriverName(p.driverNameFor(ctx))}
	if policy == fsgroup.OnRootMismatch {
		opts = append(opts, client.FSGroupChangePolicy(crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH))
	}
	return opts
}

// groupPolicy is how the fsGroup is given to a volume of info's pod (the pod a volume context names,
// podInfoOnMount): OnRootMismatch when the pod's securityContext.fsGroupChangePolicy says so, otherwise
// Always, Kubernetes' default. kubelet leaves the group to a driver with VOLUME_MOUNT_GROUP, which the
// proxy announces, and sends it no policy, so the proxy reads the policy from its pod cache. A pod the
// cache does not hold, or holds under another UID, gets Always.
func (p *Proxy) groupPolicy(info client.Pod) fsgroup.Policy {
	if p.pods == nil || info.Namespace == "" || info.Name == "" {
		return fsgroup.Always
	}
	pod, ok := p.pods.Pod(info.Namespace, info.Name)
	if !ok || (info.UID != "" && pod.UID != "" && info.UID != pod.UID) ||
		pod.FSGroupChangePolicy != string(corev1.FSGroupChangeOnRootMismatch) {
		return fsgroup.Always
	}
	return fsgroup.OnRootMismatch
}

// undoPublish undoes every step a publish record may stand for, in reverse, and forgets the record. A
// deferred target loses its guard first, and what it holds beyond the empty directories kubelet makes for
// a subPath is moved into the quarantine; when that cannot be, it is FailedPrecondition (releaseTarget),
// before anything else is changed.
func (p *Proxy) undoPublish(ctx context.Context, rec *Record) error {
	target := rec.Path
	if rec.Mode == ModeDeferred {
		if err := p.releaseTarget(rec); err != nil {
			return err
		}
	}
	if err := p.put(rec, PhaseUnpublishing); err != nil {
		return err
	}
	switch rec.Mode {
	case ModeDeferred:
		if _, err := p.crust.Unpublish(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: rec.VolumeID, TargetPath: target}); err != nil &&
			!errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("crustd: %w", err)
		}
	case ModeHost:
		if err := p.hostUnmount(target); err != nil {
			return err
		}
		if err := p.crust.ReleaseFromNode(ctx, target); err != nil {
			return fmt.Errorf("crustd: end the node's hold: %w", err)
		}
	}
	if _, err := p.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{
		VolumeId: rec.VolumeID, TargetPath: rec.PrivatePath,
	}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err := removePrivate(rec.PrivatePath); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "remove private path: %v", err)
	}
	if err := p.removeTarget(target); err != nil {
		return err
	}
	if err := p.journal.Delete(KindPublish, target); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "forget %s: %v", target, err)
	}
	return nil
}

// sameVolume is NotFound when the proxy holds path for another volume than volumeID: a call naming one
// volume must never act on another's path.
func sameVolume(rec *Record, volumeID string) error {
	if rec.VolumeID != volumeID {
		return errdefs.Errorf(errdefs.ErrNotFound, "volume %s is not at %s (volume %s is)", volumeID, rec.Path, rec.VolumeID)
	}
	return nil
}

// removeTarget removes the target directory the proxy created, with the empty directories kubelet made in
// it for a subPath (clearTarget: never through a link, never anything but an empty directory); it must not
// be a mount point, and must hold nothing else (FailedPrecondition, naming what it holds).
func (p *Proxy) removeTarget(target string) error {
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	notMnt, err := p.mounter.IsLikelyNotMountPoint(target)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return errdefs.Errorf(errdefs.ErrInternal, "check target path: %v", err)
	}
	if err == nil && !notMnt {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "target path %s is a mount point; not removing it", target)
	}
	if err := clearTarget(target); err != nil {
		return err
	}
	if err := unix.Rmdir(target); err != nil && !errors.Is(err, unix.ENOENT) {
		return errdefs.Errorf(errdefs.ErrInternal, "remove target path %s: %v", target, err)
	}
	return nil
}

// NodeUnpublishVolume undoes a deferred or host-mounted publish; anything else is forwarded.
func (p *Proxy) NodeUnpublishVolume(ctx context.Context, r *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	forward := func() (*csi.NodeUnpublishVolumeResponse, error) { return p.node.NodeUnpublishVolume(outgoing(ctx), r) }
	return undo(ctx, p, KindPublish, r.GetVolumeId(), r.GetTargetPath(), forward, func(rec *Record) (*csi.NodeUnpublishVolumeResponse, error) {
		if err := sameVolume(rec, r.GetVolumeId()); err != nil {
			return nil, err
		}
		if err := p.undoPublish(ctx, rec); err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	})
}

// NodeGetVolumeStats answers a deferred volume through crustd (measured in the sandbox), a host-mounted
// one with statfs, and forwards everything else.
func (p *Proxy) NodeGetVolumeStats(ctx context.Context, r *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	rec := p.journal.Get(KindPublish, r.GetVolumePath())
	if r.GetVolumeId() == "" || rec == nil {
		if has, err := p.driverHas(ctx, csi.NodeServiceCapability_RPC_GET_VOLUME_STATS); err == nil && !has &&
			r.GetVolumeId() != "" && r.GetVolumePath() != "" {
			return ownStats(r.GetVolumePath())
		}
		return p.node.NodeGetVolumeStats(outgoing(ctx), r)
	}
	if err := sameVolume(rec, r.GetVolumeId()); err != nil {
		return nil, err
	}
	if rec.Phase != PhasePublished || rec.Stale {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "%s is not published (%s)", rec.Path, rec.Phase)
	}
	switch rec.Mode {
	case ModeDeferred:
		resp, err := p.crust.Stats(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("crustd: %w", err)
		}
		return resp, nil
	default:
		return statfsUsage(rec.Path)
	}
}

// NodeExpandVolume expands a deferred volume through crustd (in the sandbox) and a host-mounted one on
// the host, after the driver's NodeExpandVolume on the private raw block path. For a path the proxy
// staged as raw block, the capability is rewritten to Block before forwarding; anything else is
// forwarded unchanged.
func (p *Proxy) NodeExpandVolume(ctx context.Context, r *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	rec := p.journal.Get(KindPublish, r.GetVolumePath())
	if r.GetVolumeId() == "" || rec == nil {
		if r.GetVolumeId() != "" && isMount(r.GetVolumeCapability()) &&
			(p.journal.Get(KindStage, r.GetVolumePath()) != nil || p.journal.Get(KindStage, r.GetStagingTargetPath()) != nil) {
			br := proto.Clone(r).(*csi.NodeExpandVolumeRequest)
			br.VolumeCapability = blockCapability(r.GetVolumeCapability())
			return p.node.NodeExpandVolume(outgoing(ctx), br)
		}
		if has, err := p.driverHas(ctx, csi.NodeServiceCapability_RPC_EXPAND_VOLUME); err == nil && !has &&
			r.GetVolumeId() != "" && r.GetVolumePath() != "" {
			// What kubelet does for a driver without node expansion: nothing.
			if _, err := statVolumePath(r.GetVolumePath()); err != nil {
				return nil, err
			}
			return &csi.NodeExpandVolumeResponse{}, nil
		}
		return p.node.NodeExpandVolume(outgoing(ctx), r)
	}
	unlock, err := p.lock(ctx, rec.Path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec = p.journal.Get(KindPublish, r.GetVolumePath()); rec == nil || rec.Phase != PhasePublished || rec.Stale {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "%s is not published", r.GetVolumePath())
	}
	if err := sameVolume(rec, r.GetVolumeId()); err != nil {
		return nil, err
	}
	br := proto.Clone(r).(*csi.NodeExpandVolumeRequest)
	br.VolumePath = rec.PrivatePath
	br.VolumeCapability = blockCapability(r.GetVolumeCapability())
	if _, err := p.node.NodeExpandVolume(outgoing(ctx), br); err != nil {
		return nil, err
	}
	switch rec.Mode {
	case ModeDeferred:
		cr := proto.Clone(r).(*csi.NodeExpandVolumeRequest)
		if cr.GetCapacityRange().GetRequiredBytes() <= 0 { // optional in CSI; crustd grows to a size: the device's
			size, err := deviceSize(rec.Device)
			if err != nil {
				return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
			}
			cr.CapacityRange = &csi.CapacityRange{RequiredBytes: size, LimitBytes: r.GetCapacityRange().GetLimitBytes()}
		}
		resp, err := p.crust.Expand(ctx, cr)
		if err != nil {
			return nil, fmt.Errorf("crustd: %w", err)
		}
		return resp, nil
	default:
		if _, err := p.resizer.Resize(rec.Device, rec.Path); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "resize the filesystem on %s: %v", rec.Device, err)
		}
		size, err := deviceSize(rec.Device)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
		}
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
}

// NodeGetVolumeHealth answers a deferred volume through crustd (its condition as the sandbox sees it) and
// forwards everything else.
func (p *Proxy) NodeGetVolumeHealth(ctx context.Context, r *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	rec := p.journal.Get(KindPublish, r.GetVolumePublishPath())
	if r.GetVolumeId() == "" || rec == nil || rec.Mode != ModeDeferred {
		return p.node.NodeGetVolumeHealth(outgoing(ctx), r)
	}
	if err := sameVolume(rec, r.GetVolumeId()); err != nil {
		return nil, err
	}
	if rec.Phase != PhasePublished || rec.Stale {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "%s is not published (%s)", rec.Path, rec.Phase)
	}
	resp, err := p.crust.Health(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("crustd: %w", err)
	}
	return resp, nil
}
