// Package safedirtest helps tests show that nothing was done through a planted link: it records a tree
// before and compares it after, makes directories with a given owner and mode, and runs a test over
// directories planted with such owners, modes and links (EachDir).
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

// Dir is a directory a test plants where the code under test expects one of its own: made with Mode and
// owner UID (group 0), and handed over itself or, with Link, as a symbolic link to it. Name names the
// subtest. A test case type embeds Dir to be run by EachDir.
type Dir struct {
	Name string
	Mode fs.FileMode
	UID  int
	Link bool
}

func (d Dir) dir() Dir { return d }

// Planted is a test case that embeds a Dir.
type Planted interface{ dir() Dir }

// EachDir runs test in a subtest per case, named by its Dir's Name, after making the case's directory in
// a new temporary directory: path is what to hand the code under test (the link, for a Link case) and dir
// the directory itself. It skips t unless it runs as root, the only user that can give a directory
// another owner.
func EachDir[C Planted](t *testing.T, cases []C, test func(t *testing.T, tc C, path, dir string)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	for _, tc := range cases {
		d := tc.dir()
		t.Run(d.Name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "dir")
			Mkdir(t, dir, d.Mode, d.UID)
			path := dir
			if d.Link {
				path = filepath.Join(t.TempDir(), "link")
				if err := os.Symlink(dir, path); err != nil {
					t.Fatal(err)
				}
			}
			test(t, tc, path, dir)
		})
	}
}
