package agentproto

import (
	"encoding/json"
	"fmt"
)

// Op names an operation of the protocol.
type Op string

// The operations of the protocol; see the package documentation.
const (
	OpPing     Op = "ping"
	OpMount    Op = "mount"
	OpUnmount  Op = "unmount"
	OpStatfs   Op = "statfs"
	OpGrow     Op = "grow"
	OpExec     Op = "exec"
	OpShutdown Op = "shutdown"
)

// Request is one request line.
type Request struct {
	ID   uint64          `json:"id"`
	Op   Op              `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Response is one response line: exactly one of Result and Error is set
// (Result may be absent for operations with an empty result).
type Response struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Code classifies an Error.
type Code string

// The error codes.
const (
	// CodeInvalidArgument: the request is malformed or names a bad value.
	CodeInvalidArgument Code = "invalid_argument"
	// CodeNotFound: the disk, the target or the command does not exist.
	CodeNotFound Code = "not_found"
	// CodeFailedPrecondition: the state does not allow the operation, such as
	// a disk without a filesystem when create_filesystem is off.
	CodeFailedPrecondition Code = "failed_precondition"
	// CodeTimeout: a bounded wait ran out.
	CodeTimeout Code = "timeout"
	// CodeUnimplemented: the agent does not know the operation or fs type.
	CodeUnimplemented Code = "unimplemented"
	// CodeInternal: anything else.
	CodeInternal Code = "internal"
)

// Error is an error answered by the agent.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("agent: %s: %s", e.Code, e.Message) }

// Errorf returns an *Error with the given code and formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// PingResult answers ping.
type PingResult struct {
	// Kernel is the guest kernel's release (uname -r).
	Kernel string `json:"kernel"`
	// UptimeMillis is the time since the agent started.
	UptimeMillis int64 `json:"uptime_ms"`
}

// FSGroupPolicy says when mount applies the fsGroup ownership to a volume
// (Kubernetes' fsGroupChangePolicy).
type FSGroupPolicy string

// The fsGroup policies.
const (
	// FSGroupAlways walks the whole volume on every mount.
	FSGroupAlways FSGroupPolicy = "Always"
	// FSGroupOnRootMismatch walks it only when the root directory does not
	// already have the group, the setgid bit and group rwx.
	FSGroupOnRootMismatch FSGroupPolicy = "OnRootMismatch"
)

// MountArgs are the arguments of mount.
type MountArgs struct {
	// Serial is the virtio-blk serial of the disk (at most 20 bytes); for a persistent-memory device,
	// the name it is known by in the agent's log.
	Serial string `json:"serial"`
	// PmemAddress, when not zero, says the volume is a virtio-pmem device, found by the guest physical
	// address its region starts at (as QEMU placed it), not a disk found by Serial. The agent mounts it
	// with DAX (-o dax: file data is accessed in the persistent memory, with no page cache) and formats it,
	// when CreateFilesystem asks, with 4 KiB blocks as DAX needs.
	PmemAddress uint64 `json:"pmem_address,omitempty"`
	// FSType is the filesystem: "ext4" (the default), "ext3" or "xfs" (volume.FormattedFSTypes).
	FSType string `json:"fs_type,omitempty"`
	// Options are mount options ("noatime", "discard", ...).
	Options []string `json:"options,omitempty"`
	// ReadOnly mounts read-only (and skips fsGroup).
	ReadOnly bool `json:"read_only,omitempty"`
	// Target is the absolute path in the guest to mount on; it is created.
	Target string `json:"target"`
	// FSGroup, when set, is the group given to the volume's files.
	FSGroup *int64 `json:"fs_group,omitempty"`
	// FSGroupPolicy is Always when empty.
	FSGroupPolicy FSGroupPolicy `json:"fs_group_policy,omitempty"`
	// CreateFilesystem formats the disk with FSType when it carries no
	// filesystem or other signature. A disk with one is never formatted.
	CreateFilesystem bool `json:"create_filesystem,omitempty"`
	// DeviceWaitMillis bounds the wait for the disk to appear; 0 means the
	// agent's default (10 s).
	DeviceWaitMillis int64 `json:"device_wait_ms,omitempty"`
	// Block exposes the disk as a raw block volume: a block device node with
	// the disk's major:minor is made at Target (its parent directories
	// created), and nothing is mounted. FSType, Options, FSGroup,
	// FSGroupPolicy and CreateFilesystem must then be unset; ReadOnly makes
	// the node mode 0440 (the disk is read-only in the VM already).
	Block bool `json:"block,omitempty"`
}

// MountResult answers mount.
type MountResult struct {
	// Device is the guest device node, such as /dev/vda or /dev/pmem0.
	Device string `json:"device"`
	// Formatted says the agent created the filesystem.
	Formatted bool `json:"formatted,omitempty"`
	// Already says the disk was already mounted there and nothing was done.
	Already bool `json:"already,omitempty"`
	// GrewFromBytes, when not zero, says the disk was larger than the filesystem on it (it grew while no
	// sandbox used the volume) and the agent grew the filesystem to fill it once mounted; the value is
	// the filesystem's size before, as its superblock recorded it.
	GrewFromBytes uint64 `json:"grew_from_bytes,omitempty"`
}

// UnmountArgs are the arguments of unmount.
type UnmountArgs struct {
	Target string `json:"target"`
}

// StatfsArgs are the arguments of statfs.
type StatfsArgs struct {
	Target string `json:"target"`
}

// Usage is one kind of usage, in bytes or in inodes.
type Usage struct {
	Total     uint64 `json:"total"`
	Used      uint64 `json:"used"`
	Available uint64 `json:"available"`
}

// StatfsResult answers statfs. Bytes are statfs(2)'s block counts times its
// fragment size: Total = f_blocks, Used = f_blocks - f_bfree, Available =
// f_bavail. Inodes: Total = f_files, Used = f_files - f_ffree, Available =
// f_ffree.
type StatfsResult struct {
	Bytes  Usage `json:"bytes"`
	Inodes Usage `json:"inodes"`
	// Abnormal is true when the volume is unhealthy; Message says why.
	Abnormal bool   `json:"abnormal,omitempty"`
	Message  string `json:"message,omitempty"`
}

// GrowArgs are the arguments of grow.
type GrowArgs struct {
	Target string `json:"target"`
	// MinDeviceBytes makes the agent wait (up to a bound) until the disk
	// reports at least this size, covering the delay between the host's
	// resize and the guest seeing it.
	MinDeviceBytes uint64 `json:"min_device_bytes,omitempty"`
}

// GrowResult answers grow.
type GrowResult struct {
	// DeviceBytes is the size of the disk as the guest sees it.
	DeviceBytes uint64 `json:"device_bytes"`
	// CapacityBytes is the filesystem's total size after growing (as statfs
	// Bytes.Total).
	CapacityBytes uint64 `json:"capacity_bytes"`
}

// ExecArgs are the arguments of exec.
type ExecArgs struct {
	// Argv is the command; Argv[0] is looked up in the guest's PATH.
	Argv []string `json:"argv"`
	// TimeoutMillis bounds the run; 0 means the agent's default (30 s). On
	// timeout the command's process group is killed.
	TimeoutMillis int64 `json:"timeout_ms,omitempty"`
}

// ExecResult answers exec.
type ExecResult struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	// ExitStatus is the exit code, or 128+signal when a signal ended it.
	ExitStatus int `json:"exit_status"`
	// TimedOut says the timeout killed the command.
	TimedOut bool `json:"timed_out,omitempty"`
	// Truncated says stdout or stderr went over MaxExecOutput.
	Truncated bool `json:"truncated,omitempty"`
}
