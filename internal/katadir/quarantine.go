package katadir

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/internal/problems"
)

// What the Adapter sets aside instead of failing for (each logged at Warn when first seen and listed by
// Problems):
//
//   - A descriptor whose projection cannot be written (something other than a directory where its
//     volume directory belongs, an I/O error) stays held and served to crust's own handlers, and is
//     quarantined: reported, and healed by the next stage of it that writes the projection or by its
//     unstage. A target path too long for a Kata directory name is no such failure: the projection
//     leaves that volume out (Projects) and its Kata caveats say so.
//   - Files with non-UTF-8 names in a volume directory are not claims (see Projection.SandboxIDs) and
//     are reported until they are gone.

// projectionKinds are the kinds of a projection that could not be written; a target has at most one.
var projectionKinds = []crustv1.ProblemKind{
	crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY,
	crustv1.ProblemKind_PROBLEM_KIND_KATA_WRITE_FAILED,
}

// quarantine records that the projection of target could not be written or removed (err, from the
// projection) and logs it when it is news. held says whether crustd holds the volume.
func (a *Adapter) quarantine(target string, err error, held bool) {
	kind := Kind(err)
	p := &crustv1.Problem{
		Kind:             kind,
		VolumeTargetPath: target,
		Path:             a.volumeDir(target),
		Message:          err.Error(),
	}
	served := "crustd holds the volume and serves it to crust's own runtime handlers, but "
	switch {
	case !held:
		p.Message = "the record of this volume was dropped, but its Kata projection could not be removed: " + err.Error()
		p.Remedy = fmt.Sprintf("A Kata runtime may still find this volume. Remove %s by hand, or run "+
			"`crustctl direct-volume remove --kata-dir %s --volume-path %s`.", p.GetPath(), a.proj.Dir(), target)
	case kind == crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY:
		p.Message = "an entry crustd did not write is where the volume's Kata directory or its mountInfo.json " +
			"belongs (path); crustd neither writes through it nor replaces it: " + err.Error()
		p.Remedy = served + "a Kata runtime does not find it. Find out what put that entry there and delete it, " +
			"then stage the volume again (its CSI driver does on the next NodePublishVolume) or restart crustd; " +
			"unstaging the volume removes the entry too."
	default:
		p.Remedy = served + "a Kata runtime may find an old projection or none. Fix the cause named above (space, " +
			"permissions of --kata-dir), then stage the volume again or restart crustd."
	}
	if a.problems.Put(p, projectionKinds...) {
		a.log.Warn("quarantined a volume whose Kata projection cannot be written", "target", target,
			"reason", problems.Reason(kind), "held", held, "err", err)
	}
}

// healed forgets target's projection problem once its projection is right (written or removed).
func (a *Adapter) healed(target string) {
	if a.problems.Drop(target, projectionKinds...) {
		a.log.Info("the Kata projection of a quarantined volume is right again", "target", target)
	}
}

// noteBadNames records (or, with none, forgets) the files of target's volume directory whose names are
// not UTF-8.
func (a *Adapter) noteBadNames(target string, bad []string) {
	kind := crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE
	if len(bad) == 0 {
		a.problems.Drop(target, kind)
		return
	}
	dir := a.volumeDir(target)
	quoted := make([]string, len(bad))
	for i, n := range bad {
		quoted[i] = shellQuote(n)
	}
	p := &crustv1.Problem{
		Kind:             kind,
		VolumeTargetPath: target,
		Path:             dir,
		Message: fmt.Sprintf("the Kata volume directory holds files whose names are not UTF-8: %s. No Kata shim writes "+
			"such names, so crust does not count them as claims; but Kata's own direct-volume stats and resize take "+
			"the first name in the directory for the sandbox id", strings.Join(quoted, " ")),
		Remedy: fmt.Sprintf("Find out what wrote them, then delete them (in bash: cd %s && rm -- %s); unstaging the "+
			"volume removes them with its directory.", dir, strings.Join(quoted, " ")),
	}
	if a.problems.Put(p) {
		a.log.Warn("a Kata volume directory holds files whose names are not UTF-8; they are not counted as claims",
			"target", target, "reason", problems.Reason(kind), "names", quoted)
	}
}

// Look reads every held volume's Kata directory again, so that what was planted, damaged or deleted
// since is seen: a held volume whose Kata directory is gone or is not a directory is quarantined then,
// as at start. It changes nothing on disk.
func (a *Adapter) Look(ctx context.Context) {
	if a.core == nil {
		return
	}
	for _, v := range a.core.AllHeld() {
		if !Projects(v.GetSpec()) {
			continue
		}
		t := v.GetSpec().GetVolumeTargetPath()
		if _, bad, err := a.proj.SandboxIDs(t); err == nil {
			a.noteBadNames(t, bad)
		} else {
			a.recheck(ctx, t)
		}
	}
}

// recheck reads target's Kata directory again under the target's lock (an unstage may be removing it)
// and quarantines the volume when it is still held and its directory is gone or not a directory. A
// target busy for longer than the lock wait is left for the next look.
func (a *Adapter) recheck(ctx context.Context, target string) {
	_ = a.core.Locked(ctx, target, func(v *crustv1.Volume) {
		if v == nil || !Projects(v.GetSpec()) {
			return
		}
		_, bad, err := a.proj.SandboxIDs(target)
		switch {
		case err == nil:
			a.noteBadNames(target, bad)
		case errors.Is(err, errdefs.ErrNotFound):
			a.quarantine(target, fmt.Errorf("%w (the volume's Kata directory was removed after crustd wrote it)", err), true)
		default:
			a.quarantine(target, err, true)
		}
	})
}

// Problems returns what the adapter set aside, without the reports of non-UTF-8 names of volumes no
// longer held (a read that raced with an unstage may have made one).
func (a *Adapter) Problems() []*crustv1.Problem {
	if a.core != nil {
		for _, t := range a.problems.Targets(crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE) {
			if a.core.Held(t) == nil {
				a.problems.Drop(t, crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE)
			}
		}
	}
	return a.problems.All()
}

// volumeDir is target's Kata volume directory.
func (a *Adapter) volumeDir(target string) string {
	return filepath.Join(a.proj.Dir(), kata.VolumeDirName(target))
}

// shellQuote writes a file name as bash's $'...' form: printable, UTF-8, and pasteable into a shell.
func shellQuote(name string) string {
	q := strconv.Quote(name)
	return "$'" + strings.ReplaceAll(q[1:len(q)-1], "'", `\'`) + "'"
}
