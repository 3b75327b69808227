package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"crust.dev/crust/internal/errdefs"
	"crust.dev/crust/internal/kata"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
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

// problemKey identifies one problem; a volume has at most one of each kind.
type problemKey struct {
	kind   crustv1.ProblemKind
	target string
	path   string
}

// problems is the set of known problems; its own lock, never held with m.mu.
type problems struct {
	mu  sync.Mutex
	set map[problemKey]*crustv1.Problem
}

// projectionKinds are the kinds of a projection that could not be written; a target has at most one.
var projectionKinds = []crustv1.ProblemKind{
	crustv1.ProblemKind_PROBLEM_KIND_KATA_NOT_A_DIRECTORY,
	crustv1.ProblemKind_PROBLEM_KIND_KATA_PATH_TOO_LONG,
	crustv1.ProblemKind_PROBLEM_KIND_KATA_WRITE_FAILED,
}

// put records p, replacing the problems of target of the kinds in replace, and says whether p is news
// (not already known with the same message).
func (ps *problems) put(p *crustv1.Problem, replace ...crustv1.ProblemKind) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	key := problemKey{p.GetKind(), p.GetVolumeTargetPath(), p.GetPath()}
	old := ps.set[key]
	for k := range ps.set {
		if k.target == p.GetVolumeTargetPath() && slices.Contains(replace, k.kind) {
			delete(ps.set, k)
		}
	}
	if ps.set == nil {
		ps.set = map[problemKey]*crustv1.Problem{}
	}
	ps.set[key] = p
	return old == nil || old.GetMessage() != p.GetMessage()
}

// drop forgets the problems of target of the given kinds and says whether there were any.
func (ps *problems) drop(target string, kinds ...crustv1.ProblemKind) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	found := false
	for k := range ps.set {
		if k.target == target && slices.Contains(kinds, k.kind) {
			delete(ps.set, k)
			found = true
		}
	}
	return found
}

// has says whether target has a problem of one of the kinds.
func (ps *problems) has(target string, kinds ...crustv1.ProblemKind) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k := range ps.set {
		if k.target == target && slices.Contains(kinds, k.kind) {
			return true
		}
	}
	return false
}

// all returns copies of the problems, ordered by kind, target path and path, after dropping the reports
// of moved-aside records whose file is gone.
func (ps *problems) all() []*crustv1.Problem {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]*crustv1.Problem, 0, len(ps.set))
	for k, p := range ps.set {
		if k.kind == crustv1.ProblemKind_PROBLEM_KIND_CORRUPT_RECORD {
			if _, err := os.Lstat(k.path); errors.Is(err, os.ErrNotExist) {
				delete(ps.set, k)
				continue
			}
		}
		out = append(out, proto.CloneOf(p))
	}
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
	case kind == crustv1.ProblemKind_PROBLEM_KIND_KATA_NOT_A_DIRECTORY:
		p.Message = "something other than a directory is where the volume's Kata directory belongs (path); " +
			"crustd does not replace what it did not write"
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
// target path and path. It reads every held volume's Kata directory again first, so that files planted
// or deleted since are seen. It changes nothing on disk.
func (m *Manager) Problems(_ context.Context) []*crustv1.Problem {
	m.mu.RLock()
	targets := slices.Collect(maps.Keys(m.vols))
	m.mu.RUnlock()
	for _, t := range targets {
		if _, bad, err := m.cfg.Projection.SandboxIDs(t); err == nil {
			m.noteBadNames(t, bad)
		}
	}
	return m.problems.all()
}

// ProblemCounts returns how many problems are known, by reason (the kind's name in lower case without
// its prefix, such as "kata_not_a_directory"); every reason is present. For the metric.
func (m *Manager) ProblemCounts() map[string]int {
	counts := map[string]int{}
	for _, v := range crustv1.ProblemKind_value {
		if k := crustv1.ProblemKind(v); k != crustv1.ProblemKind_PROBLEM_KIND_UNSPECIFIED {
			counts[reason(k)] = 0
		}
	}
	for _, p := range m.problems.all() {
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
