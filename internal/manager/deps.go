package manager

import (
	"context"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/hostdev"
)

// What the manager depends on. Each is an interface the daemon's wiring fills (internal/daemon): the
// manager knows no store format, no validation rule and no runtime.

// Store makes descriptors durable; it is the commit point of every change.
type Store interface {
	// Put writes v's record in place of the one of its target path, durably.
	Put(v *crustv1.Volume) error
	// Delete removes target's record, durably; a target without one is not an error.
	Delete(target string) error
}

// Loaded is what the store kept at start, given to Open.
type Loaded struct {
	// Volumes are the records of this boot.
	Volumes []*crustv1.Volume
	// Dropped are the target paths of records of another boot, which the store deleted.
	Dropped []string
	// Corrupt are the files of records that could not be read, which the store moved aside.
	Corrupt []string
}

// Validator checks what callers ask for; its errors are *errdefs.FieldError or carry an errdefs kind.
type Validator interface {
	// Volume checks a spec to stage and returns the descriptor it makes: the normalised spec, the
	// resolved backing path and the device number (the stage time is the manager's).
	Volume(spec *crustv1.VolumeSpec) (*crustv1.Volume, error)
	// NodeHold checks a hold of the node's on a device and returns the record that keeps it: a Volume whose
	// spec names the target path, the device (VOLUME_TYPE_BLOCK) and read_only, with the resolved device,
	// its number and the hold (the hold time is the manager's).
	NodeHold(h *crustv1.NodeHold) (*crustv1.Volume, error)
	// TargetName checks a volume target path named by field as the name of a descriptor to look up,
	// without touching the filesystem (Volume checked the path of every descriptor held).
	TargetName(field, target string) error
	// SameDevice says why v's backing path no longer leads to the device staged, or nil.
	SameDevice(v *crustv1.Volume) error
	// SandboxID checks a sandbox id named by field.
	SandboxID(field, id string) error
	// HandlerEndpoint checks a handler endpoint named by field ("" is none).
	HandlerEndpoint(field, endpoint string) error
}

// HostMounts tells whether the host has a volume's device mounted: a filesystem mounted by the host and
// by a sandbox at once is corrupted, so a volume is neither staged nor claimed while it is.
type HostMounts interface {
	// NotMounted returns nil when the host has mounted neither v's device nor any device built on it (a
	// partition, a device-mapper or md device), and for a volume backed by a regular file, which has no
	// device of its own; otherwise an error of kind errdefs.ErrFailedPrecondition that names where it is
	// mounted, or of another kind when that cannot be told.
	NotMounted(v *crustv1.Volume) error
}

// Devices tells what a volume's device writes to, so that the one-writer rule holds for a device under
// any of its names: two loop devices over one file, a partition and its disk, a device-mapper or md device
// and the devices under it.
type Devices interface {
	// StorageOf returns what v's device writes to (see hostdev.Storage); an error wrapping
	// hostdev.ErrNoBlockDevice when the kernel no longer has the device.
	StorageOf(v *crustv1.Volume) (*hostdev.Storage, error)
}

// HandlerSockets tells whether crustd can reach a runtime handler's endpoint: a claim whose endpoint
// crustd cannot dial is refused rather than recorded, since crustd could never forward to it and would
// take the handler for gone.
type HandlerSockets interface {
	// Reachable returns nil when crustd sees the socket of endpoint (one HandlerEndpoint accepted; ""
	// is nil), or an error of kind errdefs.ErrFailedPrecondition that names the path and where a
	// handler's socket must lie.
	Reachable(endpoint string) error
}

// Revisions keeps the watch revision counter across restarts of crustd (see Watch): what it kept is
// read once, at Open, and replaced at Open, every RevisionBlock revisions, and at Close.
type Revisions interface {
	// KeptRevision returns what KeepRevision kept last, as read when the store was opened: a zero
	// revision, not stopped, when nothing was kept (or what was could not be read, which the store logs).
	KeptRevision() (revision uint64, stopped bool, state string)
	// KeepRevision replaces what is kept, durably: with stopped, the last revision issued at a clean
	// stop and the digest of the descriptors then held (state); without, a revision above every one
	// issued so far.
	KeepRevision(revision uint64, stopped bool, state string) error
}

// Forwarder reaches the runtime handler that claimed a volume, for stats and expansion; which handler,
// and how it is reached, is its business (the claim says).
type Forwarder interface {
	// Stats measures the volume inside the sandbox that claimed it.
	Stats(ctx context.Context, v *crustv1.Volume) (*crustv1.GetVolumeStatsResponse, error)
	// Expand grows the volume to at least requiredBytes as the sandbox sees it and returns the capacity.
	// deviceBytes is the size of the device as the host now sees it.
	Expand(ctx context.Context, v *crustv1.Volume, requiredBytes, deviceBytes int64) (int64, error)
}

// Subscriber follows descriptors as they come and go, to keep something in step with them (the Kata
// projection is one). The manager calls it under the target's lock, in commit order, around the store:
//
//	stage of a new descriptor:  Check, then the store's Put, then Staged
//	stage of the same spec:     Restaged (nothing is stored)
//	unstage:                    Unstaging, then the store's Delete
//
// An error of Check, Staged, Restaged or Unstaging fails the caller's request with that error, and the
// store is left as before it: a record Staged refuses is taken back. (An error of Unstaging for a target
// not held changes nothing and is not the caller's.) With several subscribers, a refusal is not undone in
// those asked before; crustd has one, the Kata adapter. Claims, releases and expansions do not change
// what a subscriber follows; watchers see them (Watch).
type Subscriber interface {
	// Load is called once, by Open, with the descriptors the store kept and the target paths of the
	// records it dropped. It cannot fail: what it cannot do it reports among its Problems.
	Load(kept []*crustv1.Volume, dropped []string)
	// Check is asked before a new descriptor is stored.
	Check(v *crustv1.Volume) error
	// Staged follows the store's commit of a new descriptor.
	Staged(v *crustv1.Volume) error
	// Restaged follows a stage of the spec already stored: a chance to redo what failed before.
	Restaged(v *crustv1.Volume) error
	// Unstaging precedes the deletion of target's record; held is the descriptor, or nil for a target
	// the manager does not hold (an unstage of it is a no-op for the manager).
	Unstaging(target string, held *crustv1.Volume) error
	// Look looks again at what the subscriber keeps in step, so that Problems sees what changed outside
	// crustd since (Manager.Problems calls it first).
	Look(ctx context.Context)
	// Problems returns what the subscriber set aside instead of failing for, as known now.
	Problems() []*crustv1.Problem
}

// ClaimSource knows of claims made without crust's Runtime API: a runtime that records its use of a
// volume its own way (a Kata shim's sandbox-id file), or that records nothing but can be found (a Kata
// sandbox, through the CRI runtime). A claim it reports counts as any other: for the one-writer rule, for
// a Claim by another sandbox, in every answer.
type ClaimSource interface {
	// Claim returns the claim recorded outside crust on v, which has no claim of crust's, or nil. It
	// is asked at every read of v's claim.
	Claim(v *crustv1.Volume) *crustv1.Claim
	// Release ends the claims recorded outside crust on v: sandboxID's, or every one with force, and
	// returns the claim ended, or nil when there was none. Another sandbox's claim without force is
	// ErrFailedPrecondition. It is called under v's target lock.
	Release(v *crustv1.Volume, sandboxID string, force bool) (*crustv1.Claim, error)
	// Find looks for the sandbox that uses the volume at target, which nothing claims, and records it
	// through Manager.ClaimFound. It returns the volume as then claimed, or nil. Stats and Expand ask it
	// before they answer from the host, without holding the target's lock.
	Find(ctx context.Context, target string) *crustv1.Volume
}
