// Package safedirtest helps tests show that nothing was done through a planted link: it records a tree
// before and compares it after, and makes directories with a given owner and mode.
package safedirtest

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// Snapshot records every entry under dir: its path, mode and, for a regular file, its content.
func Snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Unchanged fails the test when dir differs from before, a Snapshot of it.
func Unchanged(t testing.TB, before map[string]string, dir string) {
	t.Helper()
	if after := Snapshot(t, dir); !maps.Equal(before, after) {
		t.Errorf("%s changed:\nbefore %v\nafter  %v", dir, before, after)
	}
}

// Mkdir creates the directory path with exactly mode (the umask aside) and owner uid (group 0).
func Mkdir(t testing.TB, path string, mode fs.FileMode, uid int) {
	t.Helper()
	err := os.Mkdir(path, 0o700)
	if err == nil {
		err = os.Chmod(path, mode)
	}
	if err == nil {
		err = os.Chown(path, uid, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
}
