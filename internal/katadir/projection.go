// Package katadir is all crustd does for Kata Containers, kept out of crustd's core (internal/manager):
// it keeps crustd's descriptors projected into Kata's direct-assigned volume directory, so that an
// unmodified Kata runtime finds and mounts the volumes crust holds (Projection); and its Adapter plugs
// that into the core as a subscriber to the descriptors' changes, reports the claims Kata makes its own
// way (sandbox-id files; sandboxes found through the CRI runtime, recorded through the core's ordinary
// claim path), quarantines what cannot be projected, and gives the server the Kata caveats of a volume.
//
// For each descriptor, under the Kata directory (--kata-dir, by default
// /run/kata-containers/shared/direct-volumes), the projection writes exactly:
//
//	<base64url(spec.volume_target_path)>/                directory, mode 0700
//	<base64url(spec.volume_target_path)>/mountInfo.json  file, mode 0600, the MountInfo of the spec
//
// and it uses <kata-dir>/.crust-tmp/ to prepare files before renaming them into place. Nothing else is
// ever created in a volume directory. The Kata shim that uses a volume adds an empty file named by its
// sandbox id there; the projection keeps such files when it rewrites mountInfo.json, reads them
// (SandboxIDs), and deletes them with the volume (Remove). Volume directories of targets crustd was not
// told about are never touched, since other drivers may use `kata-runtime direct-volume add`.
//
// The mountInfo.json of a spec (see MountInfo):
//
//	volume-type  "directvol" for every volume type (block device, image file, PMEM)
//	device       resolved_backing_path: the backing path as resolved and checked at stage time
//	fstype       spec.fs_type
//	options      spec.mount_flags, then "ro" when spec.read_only and not already there
//	metadata     spec.metadata, then fsGroup (decimal) and fsGroupChangePolicy (Always or OnRootMismatch)
//	             when spec.volume_supplemental_group is set, and createFilesystem "true" when
//	             spec.create_filesystem; these typed fields win over spec.metadata keys of the same name
//
// A raw block descriptor (spec.volume_mode VOLUME_MODE_BLOCK) is not projected (see Projects): Kata
// takes every direct-assigned volume for a filesystem to mount in the guest. Nor is a descriptor whose
// target path is longer than 189 bytes (see Nameable): its base64url form does not fit in a file name,
// so Kata has no directory for it. Each is held and served to crust's own handlers all the same, and
// its Kata caveats (Caveats) say why Kata will not find it.
//
// Why "directvol": Kata's Go runtime does not read volume-type at all, while runtime-rs takes a block
// device or a raw image file only with volume-type "directvol" and refuses any other value for them.
//
// Writes are atomic (see crust.dev/crust/api/kata): a reader finds either the old mountInfo.json or the
// new one, never a part. They are not fsynced, since the store is the commit point and Sync rebuilds the
// projection from it at every start (after a reboot, every volume directory of a dropped record is
// removed); removals are durable, so that a volume unstaged before a crash does not come back.
package katadir

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/sourcegraph/conc/iter"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/safedir"
)

// Projection writes descriptors into one Kata direct-volume directory. A disabled Projection (from New
// with an empty dir) does nothing and reports no sandboxes. The methods may be called concurrently for
// different target paths; calls for one target path must be serialised by the caller.
type Projection struct {
	dir *kata.Dir // nil when disabled
}

// New returns the projection into dir, opened once for the daemon's life, creating dir (mode 0700, as
// Kata does) when missing. It fails with errdefs.ErrFailedPrecondition, naming the path, the owner and
// the mode, when another user owns dir or may write in it, or when dir is a symbolic link: everything in
// it is done relative to the opened directory and never follows a link (see kata.ErrForeignEntry).
// An empty dir returns a disabled projection.
func New(dir string) (*Projection, error) {
	if dir == "" {
		return &Projection{}, nil
	}
	// The projection is rebuilt from the store at every start (Sync), so its writes need not be durable.
	d, err := kata.OpenDir(dir, kata.WithoutSync())
	if errors.Is(err, safedir.ErrInsecure) || errors.Is(err, kata.ErrForeignEntry) {
		return nil, fmt.Errorf("kata directory: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("kata directory: %w", err)
	}
	return &Projection{dir: d}, nil
}

// Enabled says whether the projection writes anything.
func (p *Projection) Enabled() bool { return p.dir != nil }

// Dir returns the Kata direct-volume directory, or "" when the projection is disabled.
func (p *Projection) Dir() string {
	if p.dir == nil {
		return ""
	}
	return p.dir.Path()
}

// Nameable reports whether target has a Kata volume directory: Kata names it by the base64url form of
// the target path, which must fit in a file name (NAME_MAX, 255 bytes), so the path may be at most
// kata.MaxVolumePathLen (189) bytes. A PersistentVolume's name may be 253 characters, so kubelet's
// target path can be longer; crustd holds such a volume and serves it to every other handler, but Kata
// itself cannot name it (`kata-runtime direct-volume add` fails for it too), so the projection leaves
// it out (Projects) and its Kata caveats say so (PathTooLongCaveat).
func Nameable(target string) bool {
	return len(target) <= kata.MaxVolumePathLen
}

// Projects reports whether the projection holds a volume of spec: every one but a raw block volume
// (volume_mode VOLUME_MODE_BLOCK) and one whose target path has no Kata directory name (Nameable). An
// unmodified Kata runtime mounts every direct-assigned volume it finds as a filesystem (its mountInfo
// needs an fstype), while a raw block volume reaches a Kata sandbox as an OCI device that kubelet maps,
// without a direct-volume entry; a projection of it would be wrong at best.
func Projects(spec *crustv1.VolumeSpec) bool {
	return spec.GetVolumeMode() != crustv1.VolumeMode_VOLUME_MODE_BLOCK && Nameable(spec.GetVolumeTargetPath())
}

// Write projects v: it writes the MountInfo of v's spec as the mountInfo.json of its target path,
// atomically, keeping the sandbox-id files already there. Writing the same descriptor again is a no-op
// (the file is not rewritten when its content is already right). Something other than a directory where
// the volume directory belongs is errdefs.ErrFailedPrecondition, and is left as it is. A volume Projects
// leaves out (raw block, or a target path Kata cannot name) is not written, and is not an error.
func (p *Projection) Write(v *crustv1.Volume) error {
	if p.dir == nil {
		return nil
	}
	spec := v.GetSpec()
	if spec == nil {
		return errdefs.Field("spec", "is required")
	}
	if !Projects(spec) {
		return nil
	}
	target := spec.GetVolumeTargetPath()
	if err := p.dir.AddMountInfo(target, MountInfo(v)); err != nil {
		return wrap(target, err)
	}
	return nil
}

// Remove deletes the projection of target with its sandbox-id files, or whatever else is where its
// volume directory belongs. A target that has none (one Nameable refuses never has one) is not an
// error.
func (p *Projection) Remove(target string) error {
	if p.dir == nil || !Nameable(target) {
		return nil
	}
	return wrap(target, p.dir.Remove(target))
}

// SandboxIDs returns the sandboxes a Kata shim recorded in the projection of target, in the order Kata
// reads them (it uses the first); none is an empty list. A target that has no projection is
// errdefs.ErrNotFound; a disabled projection, and a target Nameable refuses, return empty lists.
//
// Names that are not UTF-8 are returned apart, in bad, and are not sandbox ids: a Kata shim names the
// file by its sandbox id, and sandbox ids are ASCII (containerd allows only letters, digits and "._-";
// CRI-O makes hex ids), so such a file was put there by something else and stands for no sandbox.
// Counting it as a claim would let whoever planted it hold the volume against every handler, and it
// cannot be put in an answer (protobuf strings are UTF-8). Kata itself takes the first name of the
// directory for the sandbox id, whatever it is, so such a name sorted before a real id misleads Kata's
// own stats and resize: it is reported, not ignored.
func (p *Projection) SandboxIDs(target string) (ids, bad []string, err error) {
	if p.dir == nil || !Nameable(target) {
		return nil, nil, nil
	}
	names, err := p.dir.SandboxIDs(target)
	if err != nil {
		return nil, nil, wrap(target, err)
	}
	for _, n := range names {
		if utf8.ValidString(n) {
			ids = append(ids, n)
		} else {
			bad = append(bad, n)
		}
	}
	return ids, bad, nil
}

// ForgetSandbox removes a Kata shim's record that sandboxID uses target (a forced release of a Kata
// claim); a record that is not there is not an error.
func (p *Projection) ForgetSandbox(target, sandboxID string) error {
	if p.dir == nil || !Nameable(target) {
		return nil
	}
	if err := p.dir.ForgetSandbox(target, sandboxID); err != nil {
		return wrap(target, err)
	}
	return nil
}

// Sync rebuilds the projection at daemon start: it deletes what interrupted writes left in the temporary
// directory, writes every descriptor in keep (rewriting a mountInfo.json only when its content differs,
// keeping sandbox-id files), and removes the projection of every target in drop that is not also in
// keep. It touches no other volume directory. One entry never stops it: it goes on past every failure
// and returns them by target path in failed (nil when there is none), with the error of Write or
// Remove. err is a failure to empty the temporary directory, which stops nothing either.
func (p *Projection) Sync(keep []*crustv1.Volume, drop []string) (failed map[string]error, err error) {
	if p.dir == nil {
		return nil, nil
	}
	if cerr := p.dir.CleanTemp(); cerr != nil {
		err = fmt.Errorf("clean the kata temporary directory: %w", cerr)
	}
	var mu sync.Mutex
	note := func(target string, werr error) {
		if werr == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if failed == nil {
			failed = map[string]error{}
		}
		failed[target] = werr
	}
	kept := make(map[string]bool, len(keep))
	for _, v := range keep {
		kept[v.GetSpec().GetVolumeTargetPath()] = true
	}
	// Targets are distinct, so they are written by as many workers as there are CPUs: a start over
	// thousands of descriptors is bound by this work.
	iter.ForEach(keep, func(v **crustv1.Volume) { note((*v).GetSpec().GetVolumeTargetPath(), p.Write(*v)) })
	var gone []string
	for _, target := range drop {
		if !kept[target] {
			gone = append(gone, target)
		}
	}
	iter.ForEach(gone, func(target *string) { note(*target, p.Remove(*target)) })
	return failed, err
}

// MountInfo returns what the projection writes for v (see the package documentation). The device is
// the backing path as crustd resolved and checked it at stage time, never the path as given: a link in
// that path could point elsewhere by the time Kata reads it.
func MountInfo(v *crustv1.Volume) *kata.MountInfo {
	spec := v.GetSpec()
	dev := v.GetResolvedBackingPath()
	if dev == "" {
		dev = spec.GetVolumeBackingPath()
	}
	info := &kata.MountInfo{
		VolumeType: kata.VolumeTypeDirect,
		Device:     dev,
		FsType:     spec.GetFsType(),
	}
	opts := slices.Clone(spec.GetMountFlags())
	if spec.GetReadOnly() && !slices.Contains(opts, "ro") {
		opts = append(opts, "ro") // Kata attaches the device read-only only when it sees "ro"
	}
	if len(opts) > 0 {
		info.Options = opts
	}

	md := maps.Clone(spec.GetMetadata())
	if md == nil {
		md = map[string]string{}
	}
	if spec.VolumeSupplementalGroup != nil {
		md[kata.MetadataFSGroup] = strconv.FormatInt(spec.GetVolumeSupplementalGroup(), 10)
		md[kata.MetadataFSGroupChangePolicy] = kata.FSGroupChangeAlways
		if spec.GetSupplementalGroupChangePolicy() == crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH {
			md[kata.MetadataFSGroupChangePolicy] = kata.FSGroupChangeOnRootMismatch
		}
	}
	if spec.GetCreateFilesystem() {
		md[kata.MetadataCreateFilesystem] = "true"
	}
	if len(md) > 0 {
		info.Metadata = md
	}
	return info
}

// wrap names target in err, turns a target path Kata cannot hold into bad input, and an entry planted
// where the format puts another kind into a failed precondition (it was never written through).
func wrap(target string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kata.ErrForeignEntry):
		return fmt.Errorf("kata projection of %q: %w: %w", target, err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, kata.ErrInvalidVolumePath):
		return errdefs.Field("spec.volume_target_path", "%v", err)
	case errors.Is(err, kata.ErrNotFound):
		return fmt.Errorf("kata projection of %q: %w", target, errdefs.ErrNotFound)
	}
	return fmt.Errorf("kata projection of %q: %w", target, err)
}

// Kind says which kind of problem a failed Write, Remove or SandboxIDs is, for reports. A target path
// too long for a Kata directory name is none: such a volume is left out of the projection (Projects)
// and its caveats say so, so PROBLEM_KIND_KATA_PATH_TOO_LONG is never reported.
func Kind(err error) crustv1.ProblemKind {
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY
	}
	return crustv1.ProblemKind_PROBLEM_KIND_KATA_WRITE_FAILED
}
