package store

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/safedir/safedirtest"
)

// TestPlantedLinksInTheStateDir: a symbolic link at the place of the state directory, of its lock or of
// one of its subdirectories makes Open fail with FAILED_PRECONDITION naming it, and nothing is emptied, chmodded,
// read or moved through it.
func TestPlantedLinksInTheStateDir(t *testing.T) {
	for _, sub := range []string{"", "lock", "tmp", "volumes", "corrupt", "watch"} {
		t.Run("link at "+filepath.Join("<state>", sub), func(t *testing.T) {
			base := t.TempDir()
			state := filepath.Join(base, "state")
			mustOpen(t, state, bootA) // a store that was in use
			s, _ := mustOpen(t, state, bootA)
			if err := s.Put(vol("/k/a")); err != nil {
				t.Fatal(err)
			}
			// A damaged record, so that Open would move something into corrupt/.
			if err := os.WriteFile(filepath.Join(state, "volumes", "damaged.json"), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
			// outside is what the link points at: a directory with a record, a file and a loose mode.
			outside := filepath.Join(base, "outside")
			if err := os.Mkdir(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			rec, err := os.ReadFile(recordPath(state, "/k/a"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, filepath.Base(recordPath("", "/k/planted"))), rec, 0o644); err != nil {
				t.Fatal(err)
			}
			at := filepath.Join(state, sub)
			if sub == "" {
				at = filepath.Join(base, "link")
				state = at
			} else if err := os.RemoveAll(at); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, at); err != nil {
				t.Fatal(err)
			}
			before := safedirtest.Snapshot(t, outside)
			_, _, err = reopen(t, state, bootA, Options{})
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), at) {
				t.Errorf("Open = %v; want FAILED_PRECONDITION naming %s", err, at)
			}
			safedirtest.Unchanged(t, before, outside)
		})
	}
}

// TestStateDirOwnerAndMode: crustd's state directory must be ours and writable by us alone; Open refuses
// anything else, naming the path, the owner and the mode, before it touches anything, and changes no
// mode.
func TestStateDirOwnerAndMode(t *testing.T) {
	type stateDirCase struct {
		safedirtest.Dir
		refused string // in the error; "" for accepted
		after   fs.FileMode
	}
	safedirtest.EachDir(t, []stateDirCase{
		{safedirtest.Dir{Name: "0700", Mode: 0o700}, "", 0o700},
		{safedirtest.Dir{Name: "0755 (as kubelet's DirectoryOrCreate makes it)", Mode: 0o755}, "", 0o755},
		{safedirtest.Dir{Name: "0777", Mode: 0o777}, "owned by uid 0 with mode 0777", 0o777},
		{safedirtest.Dir{Name: "0770", Mode: 0o770}, "owned by uid 0 with mode 0770", 0o770},
		{safedirtest.Dir{Name: "another user's", Mode: 0o700, UID: 1000}, "owned by uid 1000 with mode 0700", 0o700},
	}, func(t *testing.T, tc stateDirCase, state, _ string) {
		if err := os.WriteFile(filepath.Join(state, "planted"), nil, 0o666); err != nil {
			t.Fatal(err)
		}
		_, _, err := Open(state, bootA, nil)
		switch {
		case tc.refused == "" && err != nil:
			t.Fatalf("Open = %v", err)
		case tc.refused != "" && (!errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), state) ||
			!strings.Contains(err.Error(), tc.refused)):
			t.Fatalf("Open = %v; want FAILED_PRECONDITION naming %s and %q", err, state, tc.refused)
		}
		fi, err := os.Stat(state)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != tc.after {
			t.Errorf("mode %v afterwards, want %v", fi.Mode(), tc.after)
		}
		if entries, _ := os.ReadDir(state); tc.refused != "" && len(entries) != 1 {
			t.Errorf("a refused Open created %v", entries)
		}
	})
}
