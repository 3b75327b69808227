// Package problems keeps what crustd set aside instead of failing for (crustv1.Problem), by volume
// target path, for the parts that find them: the manager (store records moved aside at start) and the
// Kata adapter (projections that cannot be written, planted sandbox-id files).
//
// Promises: a Set holds at most one problem of each kind and path per target; Put says whether a
// problem is news, so that each is logged once; every operation on one target costs the same however
// many problems there are; the problems a Set hands out are copies, never its own.
package problems

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// Set is a set of problems, by target path ("" for those of no known volume). The zero value is an
// empty set; its methods may be called concurrently.
type Set struct {
	mu       sync.Mutex
	byTarget map[string][]*crustv1.Problem
}

// Put records p in place of its target's problems of p's kind and path and of the kinds in replace, and
// says whether p is news (not already known with the same message).
func (s *Set) Put(p *crustv1.Problem, replace ...crustv1.ProblemKind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	target := p.GetVolumeTargetPath()
	news := true
	kept := slices.DeleteFunc(s.byTarget[target], func(o *crustv1.Problem) bool {
		same := o.GetKind() == p.GetKind() && o.GetPath() == p.GetPath()
		if same && o.GetMessage() == p.GetMessage() {
			news = false
		}
		return same || slices.Contains(replace, o.GetKind())
	})
	if s.byTarget == nil {
		s.byTarget = map[string][]*crustv1.Problem{}
	}
	s.byTarget[target] = append(kept, p)
	return news
}

// Drop forgets the problems of target of the given kinds and says whether there were any.
func (s *Set) Drop(target string, kinds ...crustv1.ProblemKind) bool {
	return s.DropIf(target, func(o *crustv1.Problem) bool { return slices.Contains(kinds, o.GetKind()) })
}

// DropIf forgets the problems of target for which gone is true and says whether there were any.
func (s *Set) DropIf(target string, gone func(*crustv1.Problem) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.byTarget[target]
	n := len(list)
	list = slices.DeleteFunc(list, gone)
	if len(list) == 0 {
		delete(s.byTarget, target)
	} else {
		s.byTarget[target] = list
	}
	return len(list) < n
}

// Targets returns the target paths that have a problem of kind.
func (s *Set) Targets(kind crustv1.ProblemKind) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for t, list := range s.byTarget {
		if slices.ContainsFunc(list, func(o *crustv1.Problem) bool { return o.GetKind() == kind }) {
			out = append(out, t)
		}
	}
	return out
}

// Has says whether target has a problem of one of the kinds.
func (s *Set) Has(target string, kinds ...crustv1.ProblemKind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.byTarget[target], func(o *crustv1.Problem) bool { return slices.Contains(kinds, o.GetKind()) })
}

// All returns copies of the problems, in no particular order (Sort orders them).
func (s *Set) All() []*crustv1.Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*crustv1.Problem
	for _, list := range s.byTarget {
		for _, p := range list {
			out = append(out, proto.CloneOf(p))
		}
	}
	return out
}

// Sort orders problems by kind, target path and path, the order of every answer that lists them.
func Sort(ps []*crustv1.Problem) {
	slices.SortFunc(ps, func(a, b *crustv1.Problem) int {
		return cmp.Or(cmp.Compare(a.GetKind(), b.GetKind()),
			strings.Compare(a.GetVolumeTargetPath(), b.GetVolumeTargetPath()), strings.Compare(a.GetPath(), b.GetPath()))
	})
}

// Reason is the metric label and log value of a kind: its name in lower case without its prefix, such
// as "kata_foreign_entry".
func Reason(k crustv1.ProblemKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "PROBLEM_KIND_"))
}
