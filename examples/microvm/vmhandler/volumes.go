package vmhandler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	crusthandler "crust.dev/crust/api/handler"
	"crust.dev/crust/api/kata"
	crustvolume "crust.dev/crust/api/volume"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
)

// DiskID is the id of the virtio-blk disk that carries the volume staged at target, and its serial in the
// guest: "vol-" and 16 hex digits of the target's SHA-256, 20 bytes as virtio-blk's serial allows.
func DiskID(target string) string {
	sum := sha256.Sum256([]byte(target))
	return "vol-" + hex.EncodeToString(sum[:8])
}

// sandbox is what a run process holds: the VM, the volumes, and the RuntimeHandlerService it serves.
type sandbox struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer

	name     string
	endpoint string // set once ServeHandler returned, before any volume work starts
	crust    *crusthandler.Client
	vm       *vm.VM
	log      *slog.Logger

	mu       sync.Mutex         // guards order and byTarget: volumes may be added while the sandbox runs
	order    []*volume          // as given
	byTarget map[string]*volume // the same, by target
}

// volume is one volume of the sandbox and how far it got.
type volume struct {
	Volume          // GuestPath is where it is mounted first, and what stats and expansion look at
	also   []string // further guest paths where it is mounted again, in the order given
	disk   string
	kick   chan struct{} // something changed in crustd: try again

	// mounted is read by stats without mu, so that a long expansion does not hold stats up.
	mounted atomic.Bool
	// attaching is true from the claim an attach took until the volume is mounted, or the claim given
	// back: a claim crustd ends in between is taken again, as for a mounted volume (keepClaims).
	attaching atomic.Bool

	mu       sync.Mutex // serialises attach, expand and teardown; guards what follows
	claimed  bool       // a claim may be held (set before asking)
	plugged  bool       // the disk may be in the VM
	pmem     bool       // a persistent-memory volume: plugged as virtio-pmem, never unplugged
	readOnly bool
	block    bool // a raw block volume: a device node at the guest path, no filesystem
	hostPath string
	size     int64 // the disk's size as QEMU shows it to the guest
}

func newSandbox(name string, crust *crusthandler.Client, machine *vm.VM, vols []Volume, log *slog.Logger) *sandbox {
	s := &sandbox{name: name, crust: crust, vm: machine, log: log, byTarget: map[string]*volume{}}
	for _, v := range vols {
		s.add(v)
	}
	return s
}

// add adds v to the sandbox's volumes and returns the volume it belongs to: a new one, or the one of its
// target given before, which v's guest path is added to (when it is not its path already).
func (s *sandbox) add(v Volume) *volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	if vol := s.byTarget[v.Target]; vol != nil {
		if vol.GuestPath != v.GuestPath && !slices.Contains(vol.also, v.GuestPath) {
			vol.also = append(vol.also, v.GuestPath)
		}
		return vol
	}
	vol := &volume{Volume: v, disk: DiskID(v.Target), kick: make(chan struct{}, 1)}
	s.order = append(s.order, vol)
	s.byTarget[v.Target] = vol
	return vol
}

// remove takes vol, which holds nothing (no claim, no disk), out of the sandbox's volumes.
func (s *sandbox) remove(vol *volume) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byTarget[vol.Target] == vol {
		delete(s.byTarget, vol.Target)
		s.order = slices.DeleteFunc(s.order, func(v *volume) bool { return v == vol })
	}
}

// lookup is the sandbox's volume at target, or nil.
func (s *sandbox) lookup(target string) *volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byTarget[target]
}

// volumes are the sandbox's volumes as given, at the time of the call.
func (s *sandbox) volumes() []*volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

func (s *sandbox) pending() bool {
	for _, v := range s.volumes() {
		if !v.mounted.Load() {
			return true
		}
	}
	return false
}

// keepAttached attaches v, trying again each time the watch says its descriptor changed, until it is
// mounted or ctx ends.
func (s *sandbox) keepAttached(ctx context.Context, v *volume) {
	log := s.log.With("target", v.Target, "guest_path", v.GuestPath)
	for waiting := false; ; {
		ok, err := s.attach(ctx, v, log)
		switch {
		case ok || ctx.Err() != nil:
			return
		case err != nil:
			log.Error("volume not attached; trying again when its descriptor changes", "err", err)
		case !waiting:
			log.Info("nothing staged at the target yet; waiting for it")
			waiting = true
		}
		select {
		case <-v.kick:
		case <-ctx.Done():
			return
		}
	}
}

// watch kicks the volumes not yet mounted whenever crustd reports a change to their descriptor, until all
// are mounted or ctx ends. Each (re)connection first replays the existing volumes, so a volume staged
// between a refused claim and the watch's start is not missed.
func (s *sandbox) watch(ctx context.Context) {
	allDone := errors.New("every volume is mounted")
	warned, synced := false, false
	for ctx.Err() == nil && s.pending() {
		err := s.crust.Watch(ctx, true, func(ev *crustv1.WatchVolumesResponse) error {
			if ev.GetType() == crustv1.EventType_EVENT_TYPE_SYNCED && !synced {
				s.log.Info("watching crustd")
				synced = true
			}
			target := ev.GetVolume().GetSpec().GetVolumeTargetPath()
			if v := s.lookup(target); v != nil {
				// The end of this sandbox's own claim (its release of a volume it could not attach) is no
				// news: trying again on it would claim, fail and release in a loop.
				own := ev.GetType() == crustv1.EventType_EVENT_TYPE_RELEASED && ev.GetReleasedClaim().GetSandboxId() == s.name
				switch ev.GetType() {
				case crustv1.EventType_EVENT_TYPE_EXISTING, crustv1.EventType_EVENT_TYPE_STAGED, crustv1.EventType_EVENT_TYPE_RELEASED:
					if own {
						break
					}
					select {
					case v.kick <- struct{}{}:
					default:
					}
				case crustv1.EventType_EVENT_TYPE_UNSTAGED:
					if v.mounted.Load() {
						s.log.Warn("descriptor removed while the volume is mounted in the guest; it stays until stop", "target", target)
					}
				}
			}
			if !s.pending() {
				return allDone
			}
			return nil
		})
		if errors.Is(err, allDone) || ctx.Err() != nil {
			return
		}
		if err != nil && !warned {
			s.log.Warn("watching crustd failed; retrying every second", "err", err)
			warned = true
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// keepClaims claims again, until ctx ends, each volume mounted or being attached whose claim crustd ended
// while the sandbox runs (it took the handler for gone, or an operator forced the release): the device is
// still in the VM, or about to be.
func (s *sandbox) keepClaims(ctx context.Context) {
	holds := func(target string) bool {
		v := s.lookup(target)
		return v != nil && (v.mounted.Load() || v.attaching.Load() || s.inVM(v))
	}
	_ = s.crust.KeepClaims(ctx, s.name, s.endpoint, holds, func(r crusthandler.Reclaim) {
		if r.Err != nil {
			s.log.Error("crustd ended the claim of a volume mounted in the guest, and claiming it again failed",
				"target", r.Target, "reason", r.Reason, "detail", r.Detail, "err", r.Err)
			return
		}
		s.log.Warn("crustd ended the claim of a volume mounted in the guest; claimed it again",
			"target", r.Target, "reason", r.Reason, "detail", r.Detail)
	})
}

// attach claims, checks, hot-plugs and mounts v. It returns false without an error when nothing is staged
// at v's target. On an error, what was done is undone.
func (s *sandbox) attach(ctx context.Context, v *volume, log *slog.Logger) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mounted.Load() {
		return true, nil
	}
	start := time.Now()
	v.claimed = true
	desc, err := s.crust.Claim(ctx, v.Target, s.name, s.endpoint)
	v.attaching.Store(err == nil)
	if errors.Is(err, errdefs.ErrNotFound) {
		v.claimed = false
		return false, nil
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			v.claimed = false // another sandbox's claim, or a changed device: nothing of ours to release
		}
		return false, s.undo(ctx, v, fmt.Errorf("claim: %w", err))
	}
	spec := desc.GetSpec()
	v.hostPath, v.readOnly = desc.GetResolvedBackingPath(), spec.GetReadOnly()
	v.pmem = spec.GetVolumeType() == crustv1.VolumeType_VOLUME_TYPE_PMEM
	v.block = spec.GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK
	enc, err := encryption(spec, v)
	if err != nil {
		// Mounted in the clear, data its owner asked to have encrypted would be readable on the host.
		return false, s.undo(ctx, v, err)
	}
	if v.hostPath == "" {
		v.hostPath = spec.GetVolumeBackingPath()
	}
	if err := checkDevice(desc, v.hostPath); err != nil {
		return false, s.undo(ctx, v, err)
	}
	// Measured before QEMU opens it: should the device grow in between, QEMU shows more than recorded,
	// and the next expansion resizes anyway.
	if v.size, err = vm.BackingSize(v.hostPath); err != nil {
		return false, s.undo(ctx, v, err)
	}
	v.plugged = true
	var pmemAddr uint64
	if v.pmem {
		p, err := s.vm.AttachPmem(ctx, v.disk, v.hostPath, v.readOnly)
		if err != nil {
			return false, s.undo(ctx, v, fmt.Errorf("persistent-memory volume %s: %w", v.Target, err))
		}
		pmemAddr = p.Address
		log = log.With("pmem_address", fmt.Sprintf("%#x", p.Address), "host_pmem", p.Persistent)
	} else if err := s.vm.AttachBlock(ctx, v.disk, v.hostPath, v.readOnly, vm.WithIOLimits(ioLimits(spec.GetIoLimits()))); err != nil {
		return false, s.undo(ctx, v, err)
	}
	args := &agentv1.MountRequest{
		PmemAddress:      pmemAddr,
		Serial:           v.disk,
		FsType:           spec.GetFsType(),
		Options:          spec.GetMountFlags(),
		ReadOnly:         v.readOnly,
		Target:           v.GuestPath,
		FsGroup:          spec.VolumeSupplementalGroup,
		FsGroupPolicy:    agentv1.FsGroupPolicy_FS_GROUP_POLICY_ALWAYS,
		CreateFilesystem: spec.GetCreateFilesystem(),
		Encryption:       enc,
	}
	if spec.GetSupplementalGroupChangePolicy() == crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH {
		args.FsGroupPolicy = agentv1.FsGroupPolicy_FS_GROUP_POLICY_ON_ROOT_MISMATCH
	}
	if v.block { // the device node itself at the guest path
		args = &agentv1.MountRequest{Serial: v.disk, ReadOnly: v.readOnly, Target: v.GuestPath, Block: true}
	}
	res, err := s.vm.Agent().Mount(ctx, args)
	if err != nil {
		return false, s.undo(ctx, v, fmt.Errorf("mount in the guest: %w", err))
	}
	// The same disk again at each further guest path: the guest's kernel shares the mounted filesystem,
	// so what one container writes the other sees. The disk holds a filesystem by now, and growing it
	// was done at the first mount, so these mounts change nothing on it.
	for _, p := range v.also {
		again := proto.CloneOf(args)
		again.Target = p
		if _, err := s.vm.Agent().Mount(ctx, again); err != nil {
			return false, s.undo(ctx, v, fmt.Errorf("mount in the guest at %s: %w", p, err))
		}
	}
	v.mounted.Store(true)
	v.attaching.Store(false)
	attrs := []any{"device", res.GetDevice(), "disk", v.disk, "fs_type", spec.GetFsType(), "read_only", v.readOnly,
		"formatted", res.GetFormatted(), "raw_block", v.block, "took", time.Since(start).Round(time.Millisecond)}
	if len(v.also) > 0 {
		attrs = append(attrs, "also_at", strings.Join(v.also, ","))
	}
	if t := desc.GetStageTime(); t != nil {
		attrs = append(attrs, "since_staged", time.Since(t.AsTime()).Round(time.Millisecond))
	}
	if res.GetGrewFromBytes() > 0 { // expanded while no sandbox held it: grown into at mount
		attrs = append(attrs, "grew_from_bytes", res.GetGrewFromBytes(), "device_bytes", v.size, "requested_bytes", desc.GetRequestedBytes())
	}
	if l := spec.GetIoLimits(); l != nil {
		attrs = append(attrs, "io_limits", l.String())
	}
	log.Info("volume mounted", attrs...)
	return true, nil
}

// ioLimits are the descriptor's I/O limits as the VM applies them (unset: none).
func ioLimits(l *crustv1.IOLimits) vm.IOLimits {
	return vm.IOLimits{
		TotalIOPS: l.GetTotalIops(), ReadIOPS: l.GetReadIops(), WriteIOPS: l.GetWriteIops(),
		TotalBytesPerSecond: l.GetTotalBytesPerSecond(), ReadBytesPerSecond: l.GetReadBytesPerSecond(),
		WriteBytesPerSecond: l.GetWriteBytesPerSecond(),
	}
}

// undo takes back what attach did after it failed with cause, and returns cause with whatever undoing it
// failed on.
func (s *sandbox) undo(ctx context.Context, v *volume, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
	defer cancel()
	return errors.Join(cause, s.detach(ctx, v))
}

// detach unmounts v in the guest (removes its device node, for a raw block volume), unplugs its disk and
// releases its claim, each step only when the one before succeeded. A persistent-memory device cannot be
// unplugged: once in the VM it stays there, mapping its backing, and so does its claim, until the VM has
// stopped (teardown releases it then). The caller holds v.mu.
func (s *sandbox) detach(ctx context.Context, v *volume) error {
	if v.plugged {
		// Unmounting what is not mounted succeeds, so an attach cut short is covered. The further guest
		// paths go first, in reverse order; the disk is detached after the last.
		for _, p := range slices.Backward(append([]string{v.GuestPath}, v.also...)) {
			if _, err := s.vm.Agent().Unmount(ctx, &agentv1.UnmountRequest{Target: p}); err != nil {
				return fmt.Errorf("unmount %s in the guest: %w", p, err)
			}
		}
		v.mounted.Store(false)
		if s.inVM(v) {
			return nil
		}
		if !v.pmem {
			if err := s.vm.DetachBlock(ctx, v.disk); err != nil {
				return err
			}
		}
		v.plugged = false
	}
	return s.release(ctx, v)
}

// inVM reports whether v is a persistent-memory device the VM holds: one that stays, with its claim,
// until the VM stops.
func (s *sandbox) inVM(v *volume) bool {
	_, ok := s.vm.Pmems()[v.disk]
	return ok
}

func (s *sandbox) release(ctx context.Context, v *volume) error {
	v.attaching.Store(false) // before the release: its own RELEASED event is no reason to claim again
	if !v.claimed {
		return nil
	}
	if err := s.crust.Release(ctx, v.Target, s.name); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		return fmt.Errorf("release: %w", err)
	}
	v.claimed = false
	return nil
}

// detachTimeout bounds the detaching of one volume at teardown.
const detachTimeout = 30 * time.Second

// teardown detaches every volume, stops the VM, then releases the claims whose volumes could not be
// detached cleanly: with QEMU gone, nothing uses their devices any more.
func (s *sandbox) teardown(ctx context.Context) error {
	var errs []error
	vmGone := false
	select {
	case <-s.vm.Done():
		vmGone = true
	default:
	}
	vols := s.volumes()
	for _, v := range vols {
		v.mu.Lock()
		held := v.claimed || v.plugged
		if vmGone { // nothing is mounted or plugged in a VM that is gone: release only
			v.mounted.Store(false)
			v.plugged = false
		}
		dctx, cancel := context.WithTimeout(ctx, detachTimeout)
		switch err := s.detach(dctx, v); {
		case err != nil:
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Target, err))
		case held && v.claimed:
			s.log.Info("persistent-memory volume unmounted; it stays in the VM, and claimed, until the VM stops", "target", v.Target)
		case held:
			s.log.Info("volume unmounted, detached and released", "target", v.Target, "vm_gone", vmGone)
		}
		cancel()
		v.mu.Unlock()
	}
	if err := s.vm.Stop(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, v := range vols {
		v.mu.Lock()
		v.plugged = false
		if v.claimed {
			if err := s.release(ctx, v); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", v.Target, err))
			} else {
				s.log.Info("volume released after the VM stopped", "target", v.Target)
			}
		}
		v.mu.Unlock()
	}
	return errors.Join(errs...)
}

// checkDevice checks that path is still the device that was staged: a block device with the recorded
// major and minor, or for an image file the recorded filesystem and inode.
func checkDevice(desc *crustv1.Volume, path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("device: %w", err)
	}
	want := desc.GetDeviceNumber()
	var major, minor uint32
	var ino uint64
	t := desc.GetSpec().GetVolumeType()
	switch {
	case t == crustv1.VolumeType_VOLUME_TYPE_FILE || (t == crustv1.VolumeType_VOLUME_TYPE_PMEM && want.GetInode() != 0):
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("device: %s is no longer a regular file", path)
		}
		major, minor, ino = unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino
	default:
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return fmt.Errorf("device: %s is no longer a block device", path)
		}
		major, minor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
	}
	if major != want.GetMajor() || minor != want.GetMinor() || ino != want.GetInode() {
		return fmt.Errorf("device: %s is %d:%d (inode %d), but %d:%d (inode %d) was staged",
			path, major, minor, ino, want.GetMajor(), want.GetMinor(), want.GetInode())
	}
	return nil
}

// encryption is the guest's encryption of v, from its metadata's encryptionKey (nil without one): the
// key is the LUKS2 passphrase, given to the guest alone, and crust.dev/encryption-integrity "true" adds
// dm-integrity. Kata's "ephemeral" (a key made in the guest and
// lost with it) and encrypted raw block or persistent-memory volumes are refused.
func encryption(spec *crustv1.VolumeSpec, v *volume) (*agentv1.Encryption, error) {
	key, ok := spec.GetMetadata()[kata.MetadataEncryptionKey]
	switch {
	case !ok:
		return nil, nil
	case key == "ephemeral":
		return nil, fmt.Errorf("the volume asks for an ephemeral key (metadata %s: ephemeral), which crust-microvm "+
			"does not make: give the key itself", kata.MetadataEncryptionKey)
	case v.block || v.pmem:
		return nil, fmt.Errorf("the volume asks for encryption (metadata %s); crust-microvm encrypts filesystem "+
			"volumes on disks only, not raw block or persistent-memory ones", kata.MetadataEncryptionKey)
	}
	integrity, _ := strconv.ParseBool(spec.GetMetadata()[crustvolume.EncryptionIntegrityKey])
	return &agentv1.Encryption{Key: []byte(key), Integrity: integrity}, nil
}
