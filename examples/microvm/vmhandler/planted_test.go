package vmhandler

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"crust.dev/crust/api/safedir/safedirtest"
)

// TestPlantedStateDir: a sandbox state directory (or its parent) that is a link, or that another user
// owns or may write in, and a link at the lock file's place, are refused before anything is written
// through them.
func TestPlantedStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, parent, outside string)
	}{
		{"a link at the sandbox directory", func(t *testing.T, parent, outside string) {
			must(t, os.Symlink(outside, filepath.Join(parent, "sb")))
		}},
		{"a link at the lock file", func(t *testing.T, parent, outside string) {
			must(t, os.Mkdir(filepath.Join(parent, "sb"), 0o700))
			must(t, os.Symlink(filepath.Join(outside, "keep"), filepath.Join(parent, "sb", lockFile)))
		}},
		{"a sandbox directory of another user", func(t *testing.T, parent, _ string) {
			safedirtest.Mkdir(t, filepath.Join(parent, "sb"), 0o700, 1000)
		}},
		{"a parent any user may write in", func(t *testing.T, parent, _ string) {
			must(t, os.Chmod(parent, 0o777))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, outside := filepath.Join(t.TempDir(), "state"), t.TempDir()
			must(t, os.Mkdir(parent, 0o700))
			must(t, os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644))
			tc.plant(t, parent, outside)
			before := safedirtest.Snapshot(t, outside)
			st, err := lockState(parent, "sb", log)
			if err == nil {
				st.unlock()
				t.Error("lockState accepted it")
			}
			safedirtest.Unchanged(t, before, outside)
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
