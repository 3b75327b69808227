package manager

import (
	"context"
	"errors"
	"os"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/problems"
)

// What crustd sets aside instead of failing for. One bad entry never stops crustd or breaks an answer
// about the others: store records moved aside as damaged at start are reported (by the manager) until
// their file is deleted, and each subscriber reports what it could not do (the Kata adapter: projections
// that cannot be written, files planted in a volume's Kata directory). Each is logged at Warn when first
// seen, counted in the metric (ProblemCounts) and listed by Problems.

// Problems returns what crustd set aside instead of failing for (see crustv1.Problem): the store records
// moved aside at start whose file is still there, and what each subscriber reports after looking again
// at what it keeps in step (Subscriber.Look), ordered by kind, target path and path.
func (m *Manager) Problems(ctx context.Context) []*crustv1.Problem {
	for _, s := range m.cfg.Subscribers {
		s.Look(ctx)
	}
	return m.known()
}

// known is Problems without looking again.
func (m *Manager) known() []*crustv1.Problem {
	out := m.corruptRecords()
	for _, s := range m.cfg.Subscribers {
		out = append(out, s.Problems()...)
	}
	problems.Sort(out)
	return out
}

// corruptRecords returns the reports of store records moved aside at start, after forgetting those
// whose file is gone.
func (m *Manager) corruptRecords() []*crustv1.Problem {
	var out []*crustv1.Problem
	for _, p := range m.corrupt.All() {
		if _, err := os.Lstat(p.GetPath()); errors.Is(err, os.ErrNotExist) {
			m.corrupt.DropIf("", func(o *crustv1.Problem) bool { return o.GetPath() == p.GetPath() })
			continue
		}
		out = append(out, p)
	}
	return out
}

// ProblemCounts returns how many problems are known, by reason (problems.Reason: the kind's name in
// lower case without its prefix, such as "kata_foreign_entry"); every reason is present. For the metric.
func (m *Manager) ProblemCounts() map[string]int {
	counts := map[string]int{}
	for _, v := range crustv1.ProblemKind_value {
		if k := crustv1.ProblemKind(v); k != crustv1.ProblemKind_PROBLEM_KIND_UNSPECIFIED {
			counts[problems.Reason(k)] = 0
		}
	}
	for _, p := range m.known() {
		counts[problems.Reason(p.GetKind())]++
	}
	return counts
}
