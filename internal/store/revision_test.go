package store

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWatchRevisionRecord: the watch revision record is missing at first (revision zero, not stopped),
// reads back what KeepRevision kept across a reopen, is read as not stopped (and past a stop's revision)
// in another boot, and is read as missing, logged, when damaged; an older crustd's volumes/ is not where
// it lives.
func TestWatchRevisionRecord(t *testing.T) {
	dir := t.TempDir()
	open := func(boot string) (*Store, string) {
		t.Helper()
		var log bytes.Buffer
		s, _, err := Open(dir, boot, slog.New(slog.NewTextHandler(&log, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s, log.String()
	}
	want := func(s *Store, rev uint64, stopped bool, state string) {
		t.Helper()
		if r, st, d := s.KeptRevision(); r != rev || st != stopped || d != state {
			t.Errorf("kept %d %t %q, want %d %t %q", r, st, d, rev, stopped, state)
		}
	}
	s, _ := open(bootA)
	want(s, 0, false, "")
	if err := s.KeepRevision(4096, false, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.KeepRevision(17, true, "abc"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "watch", "revision.json")); err != nil {
		t.Fatalf("the record is not at watch/revision.json: %v", err)
	}
	if names, _ := os.ReadDir(filepath.Join(dir, "volumes")); len(names) != 0 {
		t.Errorf("volumes/ holds %d files; the revision record is not a volume", len(names))
	}

	s, _ = open(bootA)
	want(s, 17, true, "abc")
	s.Close()

	s, _ = open(bootB) // another boot: not a point to resume from, and the stop's revision was issued
	want(s, 18, false, "")
	if err := s.KeepRevision(9000, false, ""); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, _ = open(bootA) // bootB's ceiling, read in bootA
	want(s, 9000, false, "")
	s.Close()

	if err := os.WriteFile(filepath.Join(dir, "watch", "revision.json"), []byte(`{"version":1,"bootId":"x","sha256":"00","revision":{}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, log := open(bootA)
	want(s, 0, false, "")
	if !strings.Contains(log, "watch revision record cannot be read") {
		t.Errorf("a damaged record is not logged:\n%s", log)
	}
}
