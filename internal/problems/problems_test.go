package problems

import (
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestPutDropAll: a problem is news once per message; one of a replaced kind goes; Drop forgets by kind;
// All hands out copies; Sort orders by kind, target and path.
func TestPutDropAll(t *testing.T) {
	var s Set
	foreign, tooLong := crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY, crustv1.ProblemKind_PROBLEM_KIND_KATA_PATH_TOO_LONG
	p := func(kind crustv1.ProblemKind, target, msg string) *crustv1.Problem {
		return &crustv1.Problem{Kind: kind, VolumeTargetPath: target, Message: msg}
	}
	if !s.Put(p(foreign, "/b", "x")) || s.Put(p(foreign, "/b", "x")) || !s.Put(p(foreign, "/b", "y")) {
		t.Fatal("a problem is news once per message")
	}
	s.Put(p(tooLong, "/b", "z"), foreign)
	if s.Has("/b", foreign) || !s.Has("/b", tooLong) {
		t.Fatal("the replaced kind stayed, or the new one is missing")
	}
	s.Put(p(foreign, "/a", "x"))
	all := s.All()
	Sort(all)
	if len(all) != 2 || all[0].GetVolumeTargetPath() != "/a" || all[1].GetKind() != tooLong {
		t.Fatalf("All, sorted: %v", all)
	}
	all[0].Message = "changed"
	for _, q := range s.All() {
		if q.GetMessage() == "changed" {
			t.Fatal("All handed out the set's own problem")
		}
	}
	if !s.Drop("/b", tooLong) || s.Drop("/b", tooLong) || s.Has("/b", tooLong) {
		t.Fatal("Drop did not forget by kind, once")
	}
	if got := Reason(foreign); got != "kata_foreign_entry" {
		t.Fatalf("Reason = %q", got)
	}
}
