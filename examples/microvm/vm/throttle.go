package vm

import (
	"context"
	"fmt"
)

// IOLimits caps a disk's I/O as the guest sees it; a zero field is no limit. A total limit and a read
// or write limit of the same kind (operations, bytes) are exclusive, as QEMU requires.
type IOLimits struct {
	TotalIOPS, ReadIOPS, WriteIOPS                               int64
	TotalBytesPerSecond, ReadBytesPerSecond, WriteBytesPerSecond int64
}

// AttachOption adjusts AttachBlock.
type AttachOption func(*attachOptions)

type attachOptions struct {
	limits    IOLimits
	hostCache bool
}

// WithHostCache has QEMU read and write the disk through the host's page cache instead of around it
// (cache.direct off). A volume is attached without it: the guest has its own page cache, and a second
// one on the host only doubles the memory and hides the device's speed. It is there to compare the
// block path with file shares that use the host's page cache on equal terms (test/bench).
func WithHostCache() AttachOption {
	return func(o *attachOptions) { o.hostCache = true }
}

// WithIOLimits has QEMU throttle the disk to l from before AttachBlock returns, for as long as it is
// attached. All-zero limits are no throttling at all. The limits of an attached disk cannot be changed:
// AttachBlock of the same id with other limits fails.
//
// QEMU's legacy per-device throttling (block_set_io_throttle, on the disk's block backend, right after
// device_add) applies them, not a throttle filter node in the -blockdev graph, because a throttle node
// charges discards and write-zeroes to the write limits by their length: the guest's mkfs of a blank
// volume discards the whole device first, which at 100 MiB/s would hold a 100 GiB volume's first mount
// for 17 minutes; the device's own throttling counts reads, writes and write-zeroes, not discards. Each
// request counts as one operation whatever its size, and QEMU lets a tenth of a second's worth through
// as a burst. The limits are in force before AttachBlock returns, so before anything is mounted; only the
// guest kernel's own probe of the new disk may come first.
func WithIOLimits(l IOLimits) AttachOption {
	return func(o *attachOptions) { o.limits = l }
}

// throttled reports whether l limits anything.
func (l IOLimits) throttled() bool { return l != IOLimits{} }

// throttleGroupPrefix names a disk's QEMU throttle group, one per disk.
const throttleGroupPrefix = "crust-tg-"

// throttleArgs are the block_set_io_throttle arguments that throttle disk id to l (QEMU wants every
// rate, zero for none).
func throttleArgs(id string, l IOLimits) map[string]any {
	return map[string]any{
		"id":      "/machine/peripheral/" + diskPrefix + id + "/virtio-backend", // the block device inside the PCI device
		"group":   throttleGroupPrefix + id,
		"iops":    l.TotalIOPS,
		"iops_rd": l.ReadIOPS,
		"iops_wr": l.WriteIOPS,
		"bps":     l.TotalBytesPerSecond,
		"bps_rd":  l.ReadBytesPerSecond,
		"bps_wr":  l.WriteBytesPerSecond,
	}
}

// throttle applies l to the attached disk id; nothing when l limits nothing.
func (v *VM) throttle(ctx context.Context, id string, l IOLimits) error {
	if !l.throttled() {
		return nil
	}
	if err := v.qmp.Execute(ctx, "block_set_io_throttle", throttleArgs(id, l), nil); err != nil {
		return fmt.Errorf("vm: limiting the I/O of %s: %w", id, err)
	}
	return nil
}
