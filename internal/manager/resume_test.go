package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/validate"
)

// drain returns the events w holds now, without waiting for more.
func drain(w *Watcher) []*crustv1.WatchVolumesResponse {
	var evs []*crustv1.WatchVolumesResponse
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		default:
			return evs
		}
	}
}

// describe is events as "TYPE@revision" words, resumed marked with a "+", for messages and comparisons.
func describe(evs []*crustv1.WatchVolumesResponse) string {
	var w []string
	for _, ev := range evs {
		s := fmt.Sprintf("%s@%d", strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"), ev.GetRevision())
		if ev.GetResumed() {
			s += "+"
		}
		w = append(w, s)
	}
	return strings.Join(w, " ")
}

// changes makes n changes (a stage, then claims and releases of it in turn) and returns the revision of
// the last.
func (e *env) changes(n int) uint64 {
	e.t.Helper()
	ctx := context.Background()
	tp := e.target(0)
	for range n {
		var err error
		switch v := e.m.Held(tp); {
		case v == nil:
			_, err = e.m.Stage(ctx, e.spec(0, 0))
		case v.GetClaim() == nil:
			_, err = e.m.Claim(ctx, tp, "sb1", "")
		default:
			err = e.m.Release(ctx, tp, "sb1", false)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
	rev, _ := e.m.Revision()
	return rev
}

// TestWatchSinceReplays: a watch that resumes after a revision gets the events issued since, as they were
// sent, then SYNCED (resumed) at the current revision, then the changes as they come; from the current
// revision it gets SYNCED alone.
func TestWatchSinceReplays(t *testing.T) {
	e := newEnv(t)
	live := e.m.Watch(false)
	defer live.Stop()
	rev := e.changes(3) // staged@1 claimed@2 released@3
	sent := drain(live)
	w, err := e.m.WatchSince(rev-2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	got := drain(w)
	if want := fmt.Sprintf("CLAIMED@%d RELEASED@%d SYNCED@%d+", rev-1, rev, rev); describe(got) != want {
		t.Fatalf("resumed after %d: %s, want %s", rev-2, describe(got), want)
	}
	for i, ev := range got[:2] {
		if ev != sent[i+1] { // the very events sent then
			t.Errorf("replayed event %d is not the one sent", i)
		}
	}
	e.changes(1)
	if got := drain(w); describe(got) != fmt.Sprintf("CLAIMED@%d", rev+1) {
		t.Errorf("after the replay: %s, want the next change", describe(got))
	}

	now, _ := e.m.Revision()
	w2, err := e.m.WatchSince(now, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop()
	if got := drain(w2); describe(got) != fmt.Sprintf("SYNCED@%d+", now) {
		t.Errorf("resumed at the current revision: %s, want SYNCED alone", describe(got))
	}
}

// TestWatchSinceOutOfRange: a revision older than the history kept, or one never issued, is
// ErrOutOfRange naming the oldest revision a watch resumes after; with orExisting the watch lists every
// volume instead, its SYNCED not resumed.
func TestWatchSinceOutOfRange(t *testing.T) {
	e := newEnv(t)
	e.history = 2
	e.reopen()
	_, start := e.m.Revision()
	rev := e.changes(5)
	oldest := rev - 2
	if _, from := e.m.Revision(); from != oldest {
		t.Fatalf("resumes after %d, want %d (the last two changes kept)", from, oldest)
	}
	if w, err := e.m.WatchSince(oldest, false); err != nil {
		t.Errorf("resume from the oldest revision kept: %v", err)
	} else {
		w.Stop()
	}
	for _, since := range []uint64{start, oldest - 1, rev + 1} {
		_, err := e.m.WatchSince(since, false)
		if !errors.Is(err, errdefs.ErrOutOfRange) || !strings.Contains(err.Error(), fmt.Sprintf("resumes after revisions %d to %d", oldest, rev)) {
			t.Errorf("since %d: %v; want OutOfRange naming %d to %d", since, err, oldest, rev)
		}
		w, err := e.m.WatchSince(since, true)
		if err != nil {
			t.Fatalf("since %d, or existing: %v", since, err)
		}
		if got := describe(drain(w)); got != fmt.Sprintf("EXISTING@%d SYNCED@%d", rev, rev) {
			t.Errorf("since %d, or existing: %s; want the listing", since, got)
		}
		w.Stop()
	}
}

// TestRevisionsSurviveACleanStop: after Close, a restart goes on from the last revision and a watch
// resumes after it; one from before it does not (those changes are not kept), and the next change has the
// revision after it.
func TestRevisionsSurviveACleanStop(t *testing.T) {
	e := newEnv(t)
	rev := e.changes(3)
	e.stop()
	e.reopen()
	if cur, from := e.m.Revision(); cur != rev || from != rev {
		t.Fatalf("after a clean stop at %d: revision %d, resumes after %d; want both %d", rev, cur, from, rev)
	}
	w, err := e.m.WatchSince(rev, false)
	if err != nil {
		t.Fatalf("resume across a clean stop: %v", err)
	}
	defer w.Stop()
	if _, err := e.m.WatchSince(rev-1, false); !errors.Is(err, errdefs.ErrOutOfRange) ||
		!strings.Contains(err.Error(), fmt.Sprintf("started at revision %d", rev)) {
		t.Errorf("resume from before the stop's last revision: %v; want OutOfRange saying where crustd started", err)
	}
	e.changes(1)
	if got := describe(drain(w)); got != fmt.Sprintf("SYNCED@%d+ CLAIMED@%d", rev, rev+1) {
		t.Errorf("resumed watch: %s", got)
	}

	// A change after Close takes the clean stop back: the restart is taken as a crash.
	e.stop()
	last := e.changes(1)
	e.reopen()
	if cur, _ := e.m.Revision(); cur <= last {
		t.Errorf("after a change made past Close: revision %d, want above %d", cur, last)
	}
	if _, err := e.m.WatchSince(last, false); !errors.Is(err, errdefs.ErrOutOfRange) {
		t.Errorf("resume after a change made past Close: %v; want OutOfRange", err)
	}
}

// TestRevisionsAfterACrash: without Close, a restart goes on above every revision issued (the ceiling
// kept), and no watch from before resumes.
func TestRevisionsAfterACrash(t *testing.T) {
	e := newEnv(t)
	rev := e.changes(3)
	e.reopen() // no Close: a crash
	cur, from := e.m.Revision()
	if cur <= rev || cur != from || cur > rev+RevisionBlock {
		t.Fatalf("after a crash at %d: revision %d, resumes after %d; want one above %d, at most %d", rev, cur, from, rev, rev+RevisionBlock)
	}
	if _, err := e.m.WatchSince(rev, false); !errors.Is(err, errdefs.ErrOutOfRange) {
		t.Errorf("resume from before a crash: %v; want OutOfRange", err)
	}
	if got := e.changes(1); got != cur+1 {
		t.Errorf("the first change after the crash has revision %d, want %d", got, cur+1)
	}
}

// TestRevisionsWhenTheStateChangedWhileStopped: descriptors that are not those held at the clean stop
// (another program changed the state directory) make the restart go on from the revision after the
// stop's, from which no watch from before resumes.
func TestRevisionsWhenTheStateChangedWhileStopped(t *testing.T) {
	e := newEnv(t)
	rev := e.changes(3)
	e.stop()
	if err := e.st.Delete(e.target(0)); err != nil { // as an older crustd would, between the two
		t.Fatal(err)
	}
	e.reopen()
	if cur, from := e.m.Revision(); cur != rev+1 || from != rev+1 {
		t.Fatalf("revision %d, resumes after %d; want %d", cur, from, rev+1)
	}
	if _, err := e.m.WatchSince(rev, false); !errors.Is(err, errdefs.ErrOutOfRange) {
		t.Errorf("resume over a changed state: %v; want OutOfRange", err)
	}
}

// keptRevisions is a Revisions that counts what is kept.
type keptRevisions struct {
	kept    []uint64
	stopped bool
}

func (k *keptRevisions) KeptRevision() (uint64, bool, string) { return 0, false, "" }
func (k *keptRevisions) KeepRevision(rev uint64, stopped bool, _ string) error {
	k.kept, k.stopped = append(k.kept, rev), stopped
	return nil
}

// TestRevisionCeilingIsKeptAhead: a ceiling RevisionBlock ahead is kept at Open and again when the
// revision reaches it, so that no revision issued is ever at or above the one kept.
func TestRevisionCeilingIsKeptAhead(t *testing.T) {
	k := &keptRevisions{}
	m, err := Open(Config{Revisions: k}, Loaded{})
	if err != nil {
		t.Fatal(err)
	}
	if len(k.kept) != 1 || k.kept[0] != RevisionBlock {
		t.Fatalf("kept at Open: %v, want [%d]", k.kept, RevisionBlock)
	}
	v := &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: "/t"}}
	for range RevisionBlock + 1 {
		m.commit("/t", v, crustv1.EventType_EVENT_TYPE_EXPANDED)
		if rev, _ := m.Revision(); rev >= k.kept[len(k.kept)-1] {
			t.Fatalf("revision %d issued at or above the ceiling kept, %d", rev, k.kept[len(k.kept)-1])
		}
	}
	if len(k.kept) != 2 || k.kept[1] != 2*RevisionBlock {
		t.Errorf("kept: %v, want [%d %d]", k.kept, RevisionBlock, 2*RevisionBlock)
	}
	if err := m.Close(); err != nil || !k.stopped || k.kept[2] != RevisionBlock+1 {
		t.Errorf("Close kept %v (stopped %t), %v; want the last revision %d", k.kept, k.stopped, err, RevisionBlock+1)
	}
}

// TestClaimRefusesAnEndpointCrustdCannotSee: a claim whose endpoint's socket crustd does not see (no such
// file, a regular file) is FailedPrecondition naming the path and where sockets go, and records nothing; an
// unknown target is NotFound first; a socket, or no endpoint, is claimed.
func TestClaimRefusesAnEndpointCrustdCannotSee(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(e.root, "run", "handlers")
	e.sockets = validate.HandlerSockets{Dirs: []string{dir}}
	e.reopen()
	ctx := context.Background()
	tp := e.target(0)
	e.stage(e.spec(0, 0))
	file := filepath.Join(e.root, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(e.root, "nowhere", "h.sock"), file} {
		_, err := e.m.Claim(ctx, tp, "sb1", "unix://"+p)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), dir) {
			t.Errorf("claim with %s: %v; want FailedPrecondition naming it and %s", p, err, dir)
		}
		if _, err := e.m.Claim(ctx, e.target(1), "sb1", "unix://"+p); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("claim of an unknown target with %s: %v; want NotFound", p, err)
		}
	}
	if v := e.m.Held(tp); v.GetClaim() != nil {
		t.Fatalf("a refused claim was recorded: %v", v.GetClaim())
	}
	sock := filepath.Join(dir, "h.sock")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	if _, err := e.m.Claim(ctx, tp, "sb1", "unix://"+sock); err != nil {
		t.Errorf("claim with a socket crustd sees: %v", err)
	}
	if err := e.m.Release(ctx, tp, "sb1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Claim(ctx, tp, "sb2", ""); err != nil {
		t.Errorf("claim with no endpoint: %v", err)
	}
}

// TestEndWatches: a stopping crustd ends every watcher with ErrUnavailable, and every one started after,
// so that its server's streams end and the watchers resume once it is back.
func TestEndWatches(t *testing.T) {
	m, err := Open(Config{Revisions: &keptRevisions{}}, Loaded{})
	if err != nil {
		t.Fatal(err)
	}
	before := m.Watch(false)
	m.EndWatches()
	after := m.Watch(true)
	resumed, err := m.WatchSince(0, false)
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]*Watcher{"before": before, "after": after, "resumed after": resumed} {
		for range w.Events() { // what it was given at its start, then closed
		}
		if err := w.Err(); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "since_revision") {
			t.Errorf("watcher started %s EndWatches: %v; want Unavailable, saying how to resume", name, err)
		}
	}
}
