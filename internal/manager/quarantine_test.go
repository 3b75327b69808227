package manager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/katadir"
	"crust.dev/crust/internal/problems"
)

// volDir is the Kata volume directory of target.
func (e *env) volDir(target string) string {
	return filepath.Join(e.kataDir, kata.VolumeDirName(target))
}

// longSpec is a spec whose target path is valid for crust but too long for a Kata directory name: that
// of a PersistentVolume named with 253 characters, the longest name Kubernetes allows.
func (e *env) longSpec() *crustv1.VolumeSpec {
	s := e.spec(9, 9)
	s.VolumeTargetPath = filepath.Join(e.kubelet, "pods", "pod-long", "volumes", "kubernetes.io~csi",
		strings.Repeat("l", 253), "mount")
	return s
}

// storeOnly writes spec's record to the store and nothing else: the state a crash leaves between the
// store write and the projection, or a stage made while the projection was off.
func (e *env) storeOnly(spec *crustv1.VolumeSpec) {
	e.t.Helper()
	v, err := e.m.cfg.Validator.Volume(spec)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.m.cfg.Store.Put(v); err != nil {
		e.t.Fatal(err)
	}
}

// wantNothingHeld checks, across a restart, that no volume is held.
func (e *env) wantNothingHeld() {
	e.t.Helper()
	e.reopen()
	if n := len(e.m.List(context.Background())); n != 0 {
		e.t.Fatalf("%d volumes held after a restart, want none", n)
	}
}

// plantFile puts a regular file where target's Kata volume directory belongs.
func (e *env) plantFile(target string) {
	e.t.Helper()
	if err := os.RemoveAll(e.volDir(target)); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(e.volDir(target), []byte("not a directory"), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// wantProblems checks that the manager reports exactly the given problems, as kind and target path, in
// order, each saying what is wrong and what to do, and that the metric counts them.
func (e *env) wantProblems(want ...*crustv1.Problem) []*crustv1.Problem {
	e.t.Helper()
	got := e.m.Problems(context.Background())
	if len(got) != len(want) {
		e.t.Fatalf("problems %v, want %d: %v", got, len(want), want)
	}
	counts := map[string]int{}
	for i, p := range got {
		if p.GetKind() != want[i].GetKind() || p.GetVolumeTargetPath() != want[i].GetVolumeTargetPath() {
			e.t.Fatalf("problem %d is %v, want %v", i, p, want[i])
		}
		if p.GetMessage() == "" || p.GetRemedy() == "" {
			e.t.Fatalf("problem %v does not say what is wrong and what to do", p)
		}
		counts[problems.Reason(p.GetKind())]++
	}
	for r, n := range e.m.ProblemCounts() {
		if n != counts[r] {
			e.t.Fatalf("metric counts %d of %s, want %d", n, r, counts[r])
		}
	}
	return got
}

func problem(kind crustv1.ProblemKind, target string) *crustv1.Problem {
	return &crustv1.Problem{Kind: kind, VolumeTargetPath: target}
}

// TestStartSurvivesAFileAtAVolumeDir: a regular file where one volume's Kata directory belongs does not
// stop the start; every volume is still served, the bad one is reported, staging it again says what is
// wrong until the file is gone and then heals it.
func TestStartSurvivesAFileAtAVolumeDir(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := range 3 {
		e.stage(e.spec(i, i))
	}
	e.plantFile(e.target(1))
	if err := e.open(); err != nil {
		t.Fatalf("start with a file at a volume directory: %v", err)
	}
	if n := len(e.m.List(ctx)); n != 3 {
		t.Fatalf("%d volumes served, want 3", n)
	}
	for _, i := range []int{0, 2} {
		if _, err := os.Stat(filepath.Join(e.volDir(e.target(i)), kata.MountInfoFileName)); err != nil {
			t.Fatalf("projection of a sound volume: %v", err)
		}
	}
	got := e.wantProblems(problem(crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY, e.target(1)))
	if got[0].GetPath() != e.volDir(e.target(1)) {
		t.Fatalf("problem names %q, want the entry %s", got[0].GetPath(), e.volDir(e.target(1)))
	}
	// Crust's own handlers are served.
	if _, err := e.m.Claim(ctx, e.target(1), "sb1", ""); err != nil {
		t.Fatalf("claim of the quarantined volume: %v", err)
	}
	if err := e.m.Release(ctx, e.target(1), "sb1", false); err != nil {
		t.Fatal(err)
	}
	// Staging it again says what is wrong and leaves the file alone.
	if _, err := e.m.Stage(ctx, e.spec(1, 1)); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("stage again over the file: %v, want FailedPrecondition", err)
	}
	if fi, err := os.Lstat(e.volDir(e.target(1))); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the refused stage touched the file: %v %v", fi, err)
	}
	// Once the operator removed it, staging again heals.
	if err := os.Remove(e.volDir(e.target(1))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Stage(ctx, e.spec(1, 1)); err != nil {
		t.Fatalf("stage again once the file is gone: %v", err)
	}
	if _, err := kata.Get(e.kataDir, e.target(1)); err != nil {
		t.Fatalf("projection after the healing stage: %v", err)
	}
	e.wantProblems()
}

// TestUnstageHealsAQuarantinedVolume: unstaging a volume quarantined for a file at its Kata directory
// removes the file with the descriptor, and the report goes.
func TestUnstageHealsAQuarantinedVolume(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	e.plantFile(e.target(0))
	e.reopen()
	e.wantProblems(problem(crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY, e.target(0)))
	if _, err := e.m.Unstage(ctx, e.target(0)); err != nil {
		t.Fatalf("unstage of the quarantined volume: %v", err)
	}
	if _, err := os.Lstat(e.volDir(e.target(0))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the entry is still there after unstage: %v", err)
	}
	e.wantProblems()
	e.wantNothingHeld()
	e.wantProblems()
}

// TestStartSurvivesATargetKataCannotName: a record whose target path is too long for a Kata directory
// name, stored by a crustd that refused such a stage (left by a kill before the refusal took its record
// back) or while the projection was off, is held at the start, served to crust's own handlers and
// reported as no problem: it is left out of the projection, and its caveats say so.
func TestStartSurvivesATargetKataCannotName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	e.storeOnly(e.longSpec())
	if err := e.open(); err != nil {
		t.Fatalf("start with a target Kata cannot name: %v", err)
	}
	long := e.longSpec().GetVolumeTargetPath()
	if _, err := e.m.Claim(ctx, long, "sb1", ""); err != nil {
		t.Fatalf("the volume is still served to crust's own handlers: %v", err)
	}
	if _, err := kata.Get(e.kataDir, e.target(0)); err != nil {
		t.Fatalf("projection of the sound volume: %v", err)
	}
	e.wantProblems()
	if v, err := e.m.Get(ctx, long); err != nil || !slices.Equal(e.k.Annotate(v).GetKataCaveats(), []string{katadir.PathTooLongCaveat}) {
		t.Fatalf("Get = %v, %v; want the caveat of a path Kata cannot name", e.k.Annotate(v).GetKataCaveats(), err)
	}
}

// TestStartProjectsWhatAKillLeftInTheStore: a record written without its projection (a kill between the
// two) is projected at the next start.
func TestStartProjectsWhatAKillLeftInTheStore(t *testing.T) {
	e := newEnv(t)
	e.storeOnly(e.spec(0, 0))
	if err := e.open(); err != nil {
		t.Fatal(err)
	}
	if _, err := kata.Get(e.kataDir, e.target(0)); err != nil {
		t.Fatalf("projection after the start: %v", err)
	}
}

// TestStageOverAFileIsFailedPrecondition: a regular file where the volume directory belongs is a state
// conflict an operator must clear, not an internal error, and the refused stage stores nothing.
func TestStageOverAFileIsFailedPrecondition(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.plantFile(e.target(0))
	_, err := e.m.Stage(ctx, e.spec(0, 0))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "a regular file") {
		t.Fatalf("stage over a file: %v, want FailedPrecondition saying a regular file is there", err)
	}
	e.wantNothingHeld()
}

// TestStageOfATargetKataCannotName: a PersistentVolume's name may be 253 characters, and kubelet's target
// path of such a volume has no Kata directory name (its base64url form exceeds NAME_MAX). With the
// projection on, it is staged all the same (StageVolume answers it with its caveat), held and served to
// crust's own handlers, left out of the projection, and its Kata caveats say so in every answer; it is
// no problem to report, across a restart too. A volume at an ordinary target is still projected.
func TestStageOfATargetKataCannotName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	long := e.longSpec().GetVolumeTargetPath()
	v, err := e.m.Stage(ctx, e.longSpec())
	if err != nil {
		t.Fatalf("stage of a %d-byte target path: %v", len(long), err)
	}
	if c := e.k.Annotate(v).GetKataCaveats(); !slices.Equal(c, []string{katadir.PathTooLongCaveat}) {
		t.Fatalf("kata_caveats %q, want the caveat of a path Kata cannot name", c)
	}
	e.stage(e.spec(0, 0))
	if _, err := kata.Get(e.kataDir, e.target(0)); err != nil {
		t.Fatalf("projection of the short target: %v", err)
	}
	entries, err := os.ReadDir(e.kataDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range entries {
		if d.Name() != kata.TempDirName {
			names = append(names, d.Name())
		}
	}
	if want := []string{kata.VolumeDirName(e.target(0))}; !slices.Equal(names, want) {
		t.Fatalf("the Kata directory holds %q, want only the short target's %q", names, want)
	}
	if c, err := e.m.Claim(ctx, long, "sb1", ""); err != nil {
		t.Fatalf("claim by crust's own handler: %v, %v", c, err)
	}
	e.wantProblems()
	e.reopen()
	e.wantProblems()
	got, err := e.m.Get(ctx, long)
	if err != nil || got.GetClaim().GetSandboxId() != "sb1" || !slices.Equal(e.k.Annotate(got).GetKataCaveats(), []string{katadir.PathTooLongCaveat}) {
		t.Fatalf("after a restart: %v, %v; want it held, claimed and caveated", got, err)
	}
	if len(got.GetKataCaveats()) != 0 {
		t.Fatalf("the caveat was stored: %q", got.GetKataCaveats())
	}
	if _, err := e.m.Unstage(ctx, long); err != nil {
		t.Fatalf("unstage: %v", err)
	}
	e.wantProblems()
	if n := len(e.m.List(ctx)); n != 1 {
		t.Fatalf("%d volumes after unstage, want 1", n)
	}
}

// TestNonUTF8SandboxFileIsNoClaim: a file whose name is not UTF-8 in a volume directory is never put in
// an answer (protobuf strings must be UTF-8) and does not make the volume claimed; a real sandbox id
// beside it still does.
func TestNonUTF8SandboxFileIsNoClaim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	if err := os.WriteFile(filepath.Join(e.volDir(e.target(0)), "a\xff"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := e.m.Get(ctx, e.target(0))
	if err != nil {
		t.Fatal(err)
	}
	if c := v.GetClaim(); c != nil {
		t.Fatalf("claim %q from a file that no Kata shim writes", c.GetSandboxId())
	}
	if err := katatest.RecordSandbox(e.kataDir, e.target(0), "katasb"); err != nil {
		t.Fatal(err)
	}
	for _, v := range e.m.List(ctx) {
		if id := v.GetClaim().GetSandboxId(); id != "katasb" || !utf8.ValidString(id) {
			t.Fatalf("claim %q, want the Kata sandbox katasb", id)
		}
	}
	got := e.wantProblems(problem(crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE, e.target(0)))
	if !strings.Contains(got[0].GetMessage(), `$'a\xff'`) || !utf8.ValidString(got[0].GetMessage()+got[0].GetRemedy()) {
		t.Fatalf("the report does not quote the name safely: %v", got[0])
	}
	// A forced release ends the real claim and leaves the odd file, which stays reported until it goes.
	if err := e.m.Release(ctx, e.target(0), "", true); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.m.Get(ctx, e.target(0)); v.GetClaim() != nil {
		t.Fatalf("claim %v after a forced release", v.GetClaim())
	}
	e.wantProblems(problem(crustv1.ProblemKind_PROBLEM_KIND_KATA_BAD_SANDBOX_FILE, e.target(0)))
	if err := os.Remove(filepath.Join(e.volDir(e.target(0)), "a\xff")); err != nil {
		t.Fatal(err)
	}
	e.wantProblems()
}

// TestCorruptRecordIsReported: a store record moved aside as damaged at start is reported until its
// file is deleted.
func TestCorruptRecordIsReported(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	if err := os.WriteFile(filepath.Join(e.stateDir, "volumes", strings.Repeat("0", 64)+".json"), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.reopen()
	got := e.wantProblems(problem(crustv1.ProblemKind_PROBLEM_KIND_CORRUPT_RECORD, ""))
	if filepath.Dir(got[0].GetPath()) != filepath.Join(e.stateDir, "corrupt") {
		t.Fatalf("problem names %q, want the file in corrupt/", got[0].GetPath())
	}
	if n := len(e.m.List(ctx)); n != 1 {
		t.Fatalf("%d volumes, want the sound one", n)
	}
	if err := os.Remove(got[0].GetPath()); err != nil {
		t.Fatal(err)
	}
	e.wantProblems()
}

// TestProblemsSeeDamageAfterStart: a volume directory removed, or replaced by a file, while crustd runs
// is quarantined when Problems looks, and healed by a stage or an unstage.
func TestProblemsSeeDamageAfterStart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := range 3 {
		e.stage(e.spec(i, i))
	}
	if err := os.RemoveAll(e.volDir(e.target(0))); err != nil {
		t.Fatal(err)
	}
	e.plantFile(e.target(1))
	e.wantProblems(problem(crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY, e.target(1)),
		problem(crustv1.ProblemKind_PROBLEM_KIND_KATA_WRITE_FAILED, e.target(0)))
	if _, err := e.m.Stage(ctx, e.spec(0, 0)); err != nil {
		t.Fatalf("stage again: %v", err)
	}
	if _, err := kata.Get(e.kataDir, e.target(0)); err != nil {
		t.Fatalf("projection after the healing stage: %v", err)
	}
	if _, err := e.m.Unstage(ctx, e.target(1)); err != nil {
		t.Fatal(err)
	}
	e.wantProblems()
}

// BenchmarkProblems measures what `crustctl doctor` costs crustd on a node with many projected volumes
// and one bad entry: it reads every volume's Kata directory.
func BenchmarkProblems(b *testing.B) {
	e := newEnv(b)
	const n = 10000
	for i := range n {
		s := e.spec(i, i%64)
		s.ReadOnly = true // one device under many targets
		e.storeOnly(s)
	}
	e.plantFile(e.target(7))
	e.reopen() // projects them all
	b.ResetTimer()
	for b.Loop() {
		if got := e.m.Problems(context.Background()); len(got) != 1 {
			b.Fatalf("%d problems, want 1", len(got))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/n, "µs/volume")
}

// BenchmarkClaimAmongMany measures a claim and its release on a manager holding 10,000 volumes against
// one holding 64, side by side (the metric "10k-vs-64"), 64 devices each under read-only targets: a claim
// checks the other targets of its device (one writer per device) and should not pay for the rest.
func BenchmarkClaimAmongMany(b *testing.B) {
	ctx := context.Background()
	filled := func(n int) *env {
		e := newEnv(b)
		for i := range n {
			s := e.spec(i, i%64)
			s.ReadOnly = true
			e.storeOnly(s)
		}
		e.reopen()
		return e
	}
	few, many := filled(64), filled(10000)
	pair := func(e *env) time.Duration {
		t0 := time.Now()
		if _, err := e.m.Claim(ctx, e.target(0), "sb1", "unix:///run/h1.sock"); err != nil {
			b.Fatal(err)
		}
		if err := e.m.Release(ctx, e.target(0), "sb1", false); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var tFew, tMany time.Duration
	for b.Loop() {
		tFew += pair(few)
		tMany += pair(many)
	}
	b.ReportMetric(float64(tMany)/float64(tFew), "10k-vs-64")
}
