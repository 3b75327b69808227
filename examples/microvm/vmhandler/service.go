package vmhandler

import (
	"context"
	"math"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
)

// The sandbox serves RuntimeHandlerService, which crustd dials for the volumes this sandbox claimed.
//
// Errors: NOT_FOUND for a target that is not one of the sandbox's volumes, FAILED_PRECONDITION for one
// claimed under another sandbox id or not mounted (yet), INVALID_ARGUMENT for bad sizes; an error of the
// guest agent keeps its kind (errdefs; api/handler's server converts them), and a VM that cannot be reached
// is UNAVAILABLE.

// GetVolumeStats measures the volume's filesystem in the guest: bytes and inodes as CSI reports them (from
// statfs: total, used = total - free, available to unprivileged users), and whether the volume is abnormal
// (its disk gone, or its filesystem turned read-only under a read-write mount). A raw block volume has one
// bytes entry, its total the disk's size as the guest sees it, as CSI reports a block volume.
func (s *sandbox) GetVolumeStats(ctx context.Context, r *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	v, err := s.volumeFor(r.GetVolumeTargetPath(), r.GetSandboxId())
	if err != nil {
		return nil, err
	}
	st, err := s.vm.Agent().Statfs(ctx, &agentv1.StatfsRequest{Target: v.GuestPath})
	if err != nil {
		return nil, err
	}
	if v.block {
		return &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{
			Usage:           []*crustv1.VolumeUsage{{Total: clamp(st.GetBytes().GetTotal()), Unit: crustv1.VolumeUsage_UNIT_BYTES}},
			VolumeCondition: &crustv1.VolumeCondition{Abnormal: st.GetAbnormal(), Message: st.GetMessage()},
		}, nil
	}
	return &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{
		Usage: []*crustv1.VolumeUsage{
			usage(st.GetBytes(), crustv1.VolumeUsage_UNIT_BYTES),
			usage(st.GetInodes(), crustv1.VolumeUsage_UNIT_INODES),
		},
		VolumeCondition: &crustv1.VolumeCondition{Abnormal: st.GetAbnormal(), Message: st.GetMessage()},
	}, nil
}

// ExpandVolume makes the guest see the grown device and grows its filesystem online, without unmounting.
// The host device must already have been grown (crustd does it and says how big it is in device_bytes;
// when that is 0 the handler measures the device, and never changes its size). The disk is resized in QEMU
// only when the device is larger than the guest sees it (never shrunk); the filesystem is then grown to
// fill it. A persistent-memory volume cannot grow (UNIMPLEMENTED). A volume already large enough is grown to fill its disk, which does nothing, so repeating a
// call is a success with the same capacity. It fails with FAILED_PRECONDITION when the device is smaller
// than required_bytes or the volume is read-only. The capacity returned is the filesystem's total size, or
// for a raw block volume the disk's size as the guest sees it.
func (s *sandbox) ExpandVolume(ctx context.Context, r *crustv1.RuntimeHandlerServiceExpandVolumeRequest) (*crustv1.RuntimeHandlerServiceExpandVolumeResponse, error) {
	if r.GetRequiredBytes() <= 0 || r.GetDeviceBytes() < 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "required_bytes must be positive and device_bytes not negative, got %d and %d",
			r.GetRequiredBytes(), r.GetDeviceBytes())
	}
	v, err := s.volumeFor(r.GetVolumeTargetPath(), r.GetSandboxId())
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.mounted.Load() {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is not mounted in sandbox %s", v.Target, s.name)
	}
	if v.pmem {
		return nil, errdefs.Errorf(errdefs.ErrUnimplemented, "volume %s is persistent memory, which cannot grow: QEMU cannot resize a virtio-pmem device", v.Target)
	}
	if v.readOnly {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is read-only", v.Target)
	}
	start := time.Now()
	size := r.GetDeviceBytes()
	if size == 0 {
		if size, err = vm.BackingSize(v.hostPath); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
		}
	}
	if size < r.GetRequiredBytes() {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "the device %s is %d bytes, less than the %d required: the host device must be grown first",
			v.hostPath, size, r.GetRequiredBytes())
	}
	if size > v.size {
		if err := s.vm.ResizeBlock(ctx, v.disk, size); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
		}
		v.size = size
	}
	g, err := s.vm.Agent().Grow(ctx, &agentv1.GrowRequest{Target: v.GuestPath, MinDeviceBytes: uint64(v.size)})
	if err != nil {
		return nil, err
	}
	s.log.Info("volume grown", "target", v.Target, "device_bytes", g.GetDeviceBytes(), "capacity_bytes", g.GetCapacityBytes(),
		"took", time.Since(start).Round(time.Millisecond))
	return &crustv1.RuntimeHandlerServiceExpandVolumeResponse{CapacityBytes: clamp(g.GetCapacityBytes())}, nil
}

// volumeFor finds the sandbox's volume at target for a request naming sandboxID.
func (s *sandbox) volumeFor(target, sandboxID string) (*volume, error) {
	v := s.lookup(target)
	switch {
	case v == nil:
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s has no volume %q", s.name, target)
	case sandboxID != s.name:
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s belongs to sandbox %s, not %q", target, s.name, sandboxID)
	case !v.mounted.Load():
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is not mounted in sandbox %s (yet)", target, s.name)
	}
	return v, nil
}

func usage(u *agentv1.Usage, unit crustv1.VolumeUsage_Unit) *crustv1.VolumeUsage {
	return &crustv1.VolumeUsage{Total: clamp(u.GetTotal()), Used: clamp(u.GetUsed()), Available: clamp(u.GetAvailable()), Unit: unit}
}

func clamp(n uint64) int64 { return int64(min(n, math.MaxInt64)) }
