package kata

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"crust.dev/crust/api/safedir"
	"crust.dev/crust/api/safedir/safedirtest"
)

// plantedInfo is what a planted target holds: a valid mount info naming another device, so that a read
// through the link would be taken for kataDir.
const plantedInfo = `{"volume-type":"directvol","device":"/dev/planted","fstype":"ext4"}`

// TestPlantedLinks: a link or an entry of the wrong kind planted where the format puts a volume
// directory, its mountInfo.json, or the temporary directory is refused with ErrForeignEntry by every
// call, and nothing is written, read, moved or removed through it.
func TestPlantedLinks(t *testing.T) {
	volName := VolumeDirName(testPath)
	// outside is the directory a link points at: a mountInfo.json, a file named like a sandbox id, and a
	// "shadow" file.
	type env struct{ dir, outside string }
	linkVolume := func(t *testing.T, e env) {
		must(t, os.Symlink(e.outside, filepath.Join(e.dir, volName)))
	}
	linkMountInfo := func(t *testing.T, e env) {
		must(t, os.Mkdir(filepath.Join(e.dir, volName), 0o700))
		must(t, os.Symlink(filepath.Join(e.outside, "shadow"), filepath.Join(e.dir, volName, MountInfoFileName)))
	}
	fileAtVolume := func(t *testing.T, e env) {
		must(t, os.WriteFile(filepath.Join(e.dir, volName), []byte("x"), 0o600))
	}
	dirAtMountInfo := func(t *testing.T, e env) {
		must(t, os.MkdirAll(filepath.Join(e.dir, volName, MountInfoFileName), 0o700))
	}
	socketAtMountInfo := func(t *testing.T, e env) {
		must(t, os.Mkdir(filepath.Join(e.dir, volName), 0o700))
		// a socket's inode, as bind makes (whose path length limit the volume directory's name exceeds)
		must(t, syscall.Mknod(filepath.Join(e.dir, volName, MountInfoFileName), syscall.S_IFSOCK|0o600, 0))
	}
	ops := map[string]func(env) error{
		"Add":           func(e env) error { return Add(e.dir, testPath, testInfo) },
		"Get":           func(e env) error { _, err := Get(e.dir, testPath); return err },
		"SandboxIDs":    func(e env) error { _, err := SandboxIDs(e.dir, testPath); return err },
		"ForgetSandbox": func(e env) error { return ForgetSandbox(e.dir, testPath, "sb-outside") },
	}

	// Each planted entry, with the calls that reach it (a Get through a link at the volume directory
	// meets a link in the middle of the path).
	plants := []struct {
		what  string
		plant func(*testing.T, env)
		calls string
	}{
		{"a link at the volume directory", linkVolume, "Add Get SandboxIDs ForgetSandbox"},
		{"a link at mountInfo.json", linkMountInfo, "Add Get"},
		{"a regular file at the volume directory", fileAtVolume, "Add Get SandboxIDs"},
		{"a directory at mountInfo.json", dirAtMountInfo, "Add Get"},
		{"a socket at mountInfo.json", socketAtMountInfo, "Add Get"},
	}
	type testCase struct {
		name  string
		plant func(*testing.T, env)
		op    func(env) error
	}
	var cases []testCase
	for _, p := range plants {
		for _, call := range strings.Fields(p.calls) {
			cases = append(cases, testCase{call + " with " + p.what, p.plant, ops[call]})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := env{dir: t.TempDir(), outside: t.TempDir()}
			must(t, os.WriteFile(filepath.Join(e.outside, MountInfoFileName), []byte(plantedInfo), 0o600))
			must(t, os.WriteFile(filepath.Join(e.outside, "shadow"), []byte(plantedInfo), 0o640))
			must(t, os.WriteFile(filepath.Join(e.outside, "sb-outside"), nil, 0o600))
			tc.plant(t, e)
			before := safedirtest.Snapshot(t, e.outside)
			err := tc.op(e)
			if !errors.Is(err, ErrForeignEntry) {
				t.Errorf("err = %v, want ErrForeignEntry", err)
			}
			safedirtest.Unchanged(t, before, e.outside)
		})
	}
}

// TestRemoveTakesAwayAPlantedEntry: removing a volume removes a link or a file planted at its directory's
// place, itself and never what a link points to, so that the place heals.
func TestRemoveTakesAwayAPlantedEntry(t *testing.T) {
	for name, plant := range map[string]func(dir, outside string){
		"a link": func(dir, outside string) { must(t, os.Symlink(outside, filepath.Join(dir, VolumeDirName(testPath)))) },
		"a file": func(dir, _ string) {
			must(t, os.WriteFile(filepath.Join(dir, VolumeDirName(testPath)), []byte("x"), 0o600))
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			must(t, os.WriteFile(filepath.Join(outside, MountInfoFileName), []byte(plantedInfo), 0o600))
			plant(dir, outside)
			before := safedirtest.Snapshot(t, outside)
			if err := Remove(dir, testPath); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Join(dir, VolumeDirName(testPath))); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the planted entry is still there: %v", err)
			}
			safedirtest.Unchanged(t, before, outside)
			must(t, Add(dir, testPath, testInfo))
		})
	}
}

// TestPlantedTempDirIsReplaced: a link planted at the temporary directory's place is removed, itself,
// and the directory made anew, so writes go on and nothing is written where the link pointed.
func TestPlantedTempDirIsReplaced(t *testing.T) {
	for name, op := range map[string]func(dir string) error{
		// an Add that finds the file as it would write it writes nothing, so these two change something
		"Add of a changed mount info": func(dir string) error { return Add(dir, testPath, plantedInfo) },
		"Add of another volume":       func(dir string) error { return Add(dir, testPath+"-2", testInfo) },
		"Remove":                      func(dir string) error { return Remove(dir, testPath) },
	} {
		t.Run(name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			must(t, Add(dir, testPath, testInfo))
			must(t, os.RemoveAll(filepath.Join(dir, TempDirName)))
			must(t, os.Symlink(outside, filepath.Join(dir, TempDirName)))
			before := safedirtest.Snapshot(t, outside)
			if err := op(dir); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Lstat(filepath.Join(dir, TempDirName)); err != nil || !fi.IsDir() {
				t.Fatalf("temporary directory after %s: %v, %v; want a directory", name, fi, err)
			}
			safedirtest.Unchanged(t, before, outside)
		})
	}
}

// TestPlantedVolumeIsNotListed: List takes neither a link nor a file for a volume, and reads nothing
// through them.
func TestPlantedVolumeIsNotListed(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, MountInfoFileName), []byte(plantedInfo), 0o600))
	must(t, os.Symlink(outside, filepath.Join(dir, VolumeDirName(testPath))))
	must(t, os.Mkdir(filepath.Join(dir, VolumeDirName("/other")), 0o700))
	must(t, os.Symlink(filepath.Join(outside, MountInfoFileName), filepath.Join(dir, VolumeDirName("/other"), MountInfoFileName)))
	vols, err := List(dir)
	if err != nil || len(vols) != 0 {
		t.Fatalf("List = %v, %v; want nothing", vols, err)
	}
}

// TestKataDirOwnerAndMode: a direct-volume directory another user owns or may write in, or a link at its
// place, is refused before anything is written in it.
func TestKataDirOwnerAndMode(t *testing.T) {
	type kataDirCase struct {
		safedirtest.Dir
		want  error
		wrote bool
	}
	safedirtest.EachDir(t, []kataDirCase{
		{safedirtest.Dir{Name: "0700, ours", Mode: 0o700}, nil, true},
		{safedirtest.Dir{Name: "0755, ours (as kubelet's DirectoryOrCreate makes it)", Mode: 0o755}, nil, true},
		{safedirtest.Dir{Name: "0777", Mode: 0o777}, safedir.ErrInsecure, false},
		{safedirtest.Dir{Name: "another user's", Mode: 0o700, UID: 1000}, safedir.ErrInsecure, false},
		{safedirtest.Dir{Name: "a link at its place", Mode: 0o700, Link: true}, ErrForeignEntry, false},
	}, func(t *testing.T, tc kataDirCase, dir, kataDir string) {
		err := Add(dir, testPath, testInfo)
		if !errors.Is(err, tc.want) {
			t.Fatalf("Add = %v, want %v", err, tc.want)
		}
		entries, _ := os.ReadDir(kataDir)
		if wrote := len(entries) > 0; wrote != tc.wrote {
			t.Fatalf("entries %v after Add", entries)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
