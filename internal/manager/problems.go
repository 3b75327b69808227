package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"crust.dev/crust/internal/kata"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
	"crust.dev/crust/pkg/errdefs"
	katafmt "crust.dev/crust/pkg/kata"
)

// What crustd sets aside instead of failing for. One bad entry never stops crustd or breaks an answer
// about the others:
//
//   - A descriptor whose Kata projection cannot be written (something other than a directory where its
//     volume directory belongs, a target path too long for a Kata directory name, an I/O error) stays
//     held and served to crust's own handlers, and is quarantined: reported, and healed by the next
//     stage of it that writes the projection or by its unstage.
//   - Files with non-UTF-8 names in a volume directory are not claims (see kata.Projection.SandboxIDs)
//     and are reported until they are gone.
//   - Store records moved aside as damaged at start are reported until their file is deleted.
//
// Each is logged at Warn when first seen, counted in the metric (ProblemCounts) and listed by Problems.

// problems is the set of known problems, by target path ("" for those of no known volume), at most
// one of each kind and path per target. It has its own lock, never held with m.mu; every operation on
// one target costs the same however many problems there are.
type problems struct {
	mu       sync.Mutex
	byTarget map[string][]*crustv1.Problem
}

// projectionKinds are the kinds of a projection that could not be written; a target has at most one.
var projectionKinds = []crustv1.ProblemKind{
	crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY,
	crustv1.ProblemKind_PROBLEM_KIND_KATA_PATH_TOO_LONG,
	crustv1.ProblemKind_PROBLEM_KIND_KATA_WRITE_FAILED,
}

// put records p in place of its target's problems of p's kind and path and of the kinds in replace, and
// says whether p is news (not already known with the same message).
func (ps *problems) put(p *crustv1.Problem, replace ...crustv1.ProblemKind) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	target := p.GetVolumeTargetPath()
	news := true
	kept := slices.DeleteFunc(ps.byTarget[target], func(o *crustv1.Problem) bool {
		same := o.GetKind() == p.GetKind() && o.GetPath() == p.GetPath()
		if same && o.GetMessage() == p.GetMessage() {
			news = false
		}
		return same || slices.Contains(replace, o.GetKind())
	})
	if ps.byTarget == nil {
		ps.byTarget = map[string][]*crustv1.Problem{}
	}
	ps.byTarget[target] = append(kept, p)
	return news
}

// drop forgets the problems of target of the given kinds and says whether there were any.
func (ps *problems) drop(target string, kinds ...crustv1.ProblemKind) bool {
	return ps.dropIf(target, func(o *crustv1.Problem) bool { return slices.Contains(kinds, o.GetKind()) })
}

// dropIf forgets the problems of target for which gone is true and says whether there were any.
func (ps *problems) dropIf(target string, gone func(*crustv1.Problem) bool) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	list := ps.byTarget[target]
	n := len(list)
	list = slices.DeleteFunc(list, gone)
	if len(list) == 0 {
		delete(ps.byTarget, target)
	} else {
		ps.byTarget[target] = list
	}
	return len(list) < n
}

// targets returns the target paths that have a problem of kind.
func (ps *problems) targets(kind crustv1.ProblemKind) []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []string
	for t, list := range ps.byTarget {
		if slices.ContainsFunc(list, func(o *crustv1.Problem) bool { return o.GetKind() == kind }) {
			out = append(out, t)
		}
	}
	return out
}

// has says whether target has a problem of one of the kinds.
func (ps *problems) has(target string, kinds ...crustv1.ProblemKind) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return slices.ContainsFunc(ps.byTarget[target], func(o *crustv1.Problem) bool { return slices.Contains(kinds, o.GetKind()) })
}

// all returns copies of the problems, ordered by kind, target path and path, after dropping the reports
// of moved-aside records whose file is gone.
func (ps *problems) all() []*crustv1.Problem {
	ps.mu.Lock()
	var out []*crustv1.Problem
	for _, list := range ps.byTarget {
		for _, p := range list {
			out = append(out, proto.CloneOf(p))
		}
	}
	ps.mu.Unlock()
	out = slices.DeleteFunc(out, func(p *crustv1.Problem) bool {
		if p.GetKind() != crustv1.ProblemKind_PROBLEM_KIND_CORRUPT_RECORD {
			return false
		}
		_, err := os.Lstat(p.GetPath())
		if !errors.Is(err, os.ErrNotExist) {
			return false
		}
		ps.dropIf("", func(o *crustv1.Problem) bool { return o.GetKind() == p.GetKind() && o.GetPath() == p.GetPath() })
		return true
	})
	slices.SortFunc(out, func(a, b *crustv1.Problem) int {
		return cmp.Or(cmp.Compare(a.GetKind(), b.GetKind()),
			strings.Compare(a.GetVolumeTargetPath(), b.GetVolumeTargetPath()), strings.Compare(a.GetPath(), b.GetPath()))
	})
	return out
}

// quarantine records that the projection of target could not be written or removed (err, from the
// projection) and logs it when it is news. held says whether crustd holds the volume.
func (m *Manager) quarantine(target string, err error, held bool) {
	kind := kata.Kind(err)
	p := &crustv1.Problem{
		Kind:             kind,
		VolumeTargetPath: target,
		Path:             m.kataPath(target),
		Message:          err.Error(),
	}
	served := "crustd holds the volume and serves it to crust's own runtime handlers, but "
	switch {
	case !held:
		p.Message = "the record of this volume was dropped, but its Kata projection could not be removed: " + err.Error()
		p.Remedy = fmt.Sprintf("A Kata runtime may still find this volume. Remove %s by hand, or run "+
			"`crustctl direct-volume remove --kata-dir %s --volume-path %s`.", p.GetPath(), m.cfg.Projection.Dir(), target)
	case kind == crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY:
		p.Message = "an entry crustd did not write is where the volume's Kata directory or its mountInfo.json " +
			"belongs (path); crustd neither writes through it nor replaces it: " + err.Error()
		p.Remedy = served + "a Kata runtime does not find it. Find out what put that entry there and delete it, " +
			"then stage the volume again (its CSI driver does on the next NodePublishVolume) or restart crustd; " +
			"unstaging the volume removes the entry too."
	case kind == crustv1.ProblemKind_PROBLEM_KIND_KATA_PATH_TOO_LONG:
		p.Path = ""
		if fe := (*errdefs.FieldError)(nil); errors.As(err, &fe) {
			p.Message = "the target path " + fe.Reason
		}
		p.Remedy = served + fmt.Sprintf("a Kata runtime cannot use it. Publish it at a target path of at most %d bytes, "+
			"or run crustd with --kata-dir \"\" if no Kata runtime uses this node; unstaging the volume clears this.",
			katafmt.MaxVolumePathLen)
	default:
		p.Remedy = served + "a Kata runtime may find an old projection or none. Fix the cause named above (space, " +
			"permissions of --kata-dir), then stage the volume again or restart crustd."
	}
	if m.problems.put(p, projectionKinds...) {
		m.log.Warn("quarantined a volume whose Kata projection cannot be written", "target", target,
			"reason", reason(kind), "held", held, "err", err)
	}
}

// healed forgets target's projection problem once its projection is right (written or removed).
func (m *Manager) healed(target string) {
	if m.problems.drop(target, projectionKinds...) {
		m.log.Info("the Kata projection of a quarantined volume is right again", "target", target)
	}
}

// noteBadNames records (or, with none, forgets) the files of target's volume directory whose names are
// not UTF-8.
func (m *Manager) noteBadNames(target string, bad []string) {
	kind := crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE
	if len(bad) == 0 {
		m.problems.drop(target, kind)
		return
	}
	dir := m.kataPath(target)
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
	if m.problems.put(p) {
		m.log.Warn("a Kata volume directory holds files whose names are not UTF-8; they are not counted as claims",
			"target", target, "reason", reason(kind), "names", quoted)
	}
}

// Problems returns what crustd set aside instead of failing for (see crustv1.Problem), ordered by kind,
// target path and path. It reads every held volume's Kata directory again first, so that what was
// planted, damaged or deleted since is seen: a held volume whose Kata directory is gone or is not a
// directory is quarantined then, as at start. It changes nothing on disk.
func (m *Manager) Problems(ctx context.Context) []*crustv1.Problem {
	m.mu.RLock()
	var targets []string
	for t, v := range m.vols {
		if kata.Projects(v.GetSpec()) {
			targets = append(targets, t)
		}
	}
	m.mu.RUnlock()
	for _, t := range targets {
		if _, bad, err := m.cfg.Projection.SandboxIDs(t); err == nil {
			m.noteBadNames(t, bad)
		} else {
			m.recheck(ctx, t)
		}
	}
	return m.current()
}

// recheck reads target's Kata directory again under the target's lock (an unstage may be removing it)
// and quarantines the volume when it is still held and its directory is gone or not a directory. A
// target busy for longer than the lock wait is left for the next look.
func (m *Manager) recheck(ctx context.Context, target string) {
	unlock, err := m.locks.Lock(ctx, target)
	if err != nil {
		return
	}
	defer unlock()
	if v := m.get(target); v == nil || !kata.Projects(v.GetSpec()) {
		return
	}
	_, bad, err := m.cfg.Projection.SandboxIDs(target)
	switch {
	case err == nil:
		m.noteBadNames(target, bad)
	case errors.Is(err, errdefs.ErrNotFound):
		m.quarantine(target, fmt.Errorf("%w (the volume's Kata directory was removed after crustd wrote it)", err), true)
	default:
		m.quarantine(target, err, true)
	}
}

// current returns the known problems (see problems.all), without the reports of non-UTF-8 names of
// volumes no longer held (a read that raced with an unstage may have made one).
func (m *Manager) current() []*crustv1.Problem {
	for _, t := range m.problems.targets(crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE) {
		if m.get(t) == nil {
			m.problems.drop(t, crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE)
		}
	}
	return m.problems.all()
}

// ProblemCounts returns how many problems are known, by reason (the kind's name in lower case without
// its prefix, such as "kata_foreign_entry"); every reason is present. For the metric.
func (m *Manager) ProblemCounts() map[string]int {
	counts := map[string]int{}
	for _, v := range crustv1.ProblemKind_value {
		if k := crustv1.ProblemKind(v); k != crustv1.ProblemKind_PROBLEM_KIND_UNSPECIFIED {
			counts[reason(k)] = 0
		}
	}
	for _, p := range m.current() {
		counts[reason(p.GetKind())]++
	}
	return counts
}

// reason is the metric label and log value of a kind.
func reason(k crustv1.ProblemKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "PROBLEM_KIND_"))
}

// kataPath is target's Kata volume directory.
func (m *Manager) kataPath(target string) string {
	return filepath.Join(m.cfg.Projection.Dir(), katafmt.VolumeDirName(target))
}

// shellQuote writes a file name as bash's $'...' form: printable, UTF-8, and pasteable into a shell.
func shellQuote(name string) string {
	q := strconv.Quote(name)
	return "$'" + strings.ReplaceAll(q[1:len(q)-1], "'", `\'`) + "'"
}
