package kata

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"crust.dev/crust/api/kata/katatest"
)

// assertVolumeDir checks that dir holds exactly the volume directory name, mode 0700, with exactly files,
// each mode 0600, besides an empty temporary directory.
func assertVolumeDir(t *testing.T, dir, name string, files map[string]string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		switch e.Name() {
		case name:
		case TempDirName:
			if left, _ := os.ReadDir(filepath.Join(dir, TempDirName)); len(left) != 0 {
				t.Errorf("temporary directory not empty: %v", left)
			}
		default:
			t.Errorf("unexpected entry %q in %s", e.Name(), dir)
		}
	}
	volDir := filepath.Join(dir, name)
	fi, err := os.Lstat(volDir)
	if err != nil {
		t.Fatalf("volume directory %q: %v", name, err)
	}
	if fi.Mode() != fs.ModeDir|0o700 {
		t.Errorf("volume directory mode %v, want drwx------", fi.Mode())
	}
	got, err := os.ReadDir(volDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range got {
		names = append(names, e.Name())
		want, ok := files[e.Name()]
		if !ok {
			t.Errorf("unexpected file %q in the volume directory", e.Name())
			continue
		}
		data, err := os.ReadFile(filepath.Join(volDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != want {
			t.Errorf("%s:\n got %s\nwant %s", e.Name(), data, want)
		}
		if fi, _ := e.Info(); fi.Mode() != 0o600 {
			t.Errorf("%s mode %v, want -rw-------", e.Name(), fi.Mode())
		}
	}
	if len(names) != len(files) {
		t.Errorf("volume directory holds %v, want the %d files %v", names, len(files), files)
	}
}

// TestVectorsWrite: Add lays down exactly the directory and files Kata does, and keeps the sandbox file a
// shim recorded when it adds again.
func TestVectorsWrite(t *testing.T) {
	for _, v := range katatest.Load(t) {
		t.Run(v.Dir, func(t *testing.T) {
			if got := VolumeDirName(v.VolumePath); got != v.Dir {
				t.Fatalf("VolumeDirName(%q) = %q, want %q", v.VolumePath, got, v.Dir)
			}
			in := katatest.Input[MountInfo](t, v)
			if v.RawInput == nil && in != v.Files[MountInfoFileName] {
				t.Fatalf("MountInfo encodes as\n%s\nKata wrote\n%s", in, v.Files[MountInfoFileName])
			}
			dir := t.TempDir()
			for range 2 { // the second time changes nothing
				if err := Add(dir, v.VolumePath, in); err != nil {
					t.Fatal(err)
				}
			}
			if v.SandboxID != "" {
				if err := katatest.RecordSandbox(dir, v.VolumePath, v.SandboxID); err != nil {
					t.Fatal(err)
				}
				// Adding again keeps the sandbox file.
				if err := Add(dir, v.VolumePath, in); err != nil {
					t.Fatal(err)
				}
			}
			assertVolumeDir(t, dir, v.Dir, v.Files)
		})
	}
}

// TestVectorsRead: files laid down by hand as Kata lays them read back as Kata reads them.
func TestVectorsRead(t *testing.T) {
	for _, v := range katatest.Load(t) {
		t.Run(v.Dir, func(t *testing.T) {
			dir := t.TempDir()
			volDir := filepath.Join(dir, v.Dir)
			if err := os.Mkdir(volDir, 0o700); err != nil {
				t.Fatal(err)
			}
			for name, content := range v.Files {
				if err := os.WriteFile(filepath.Join(volDir, name), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			path, err := ParseVolumeDirName(v.Dir)
			if err != nil || path != v.VolumePath {
				t.Fatalf("ParseVolumeDirName(%q) = %q, %v; want %q", v.Dir, path, err, v.VolumePath)
			}
			info, err := Get(dir, v.VolumePath)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := katatest.MustJSON(t, info), katatest.MustJSON(t, katatest.ReadBack[MountInfo](t, v)); got != want {
				t.Errorf("Get:\n got %s\nwant %s", got, want)
			}
			ids, err := SandboxIDs(dir, v.VolumePath)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			if v.SandboxRead != "" {
				want = []string{v.SandboxRead}
			}
			if !slices.Equal(ids, want) {
				t.Errorf("sandbox ids %q, Kata reads %q", ids, v.SandboxRead)
			}
			vols, err := List(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(vols) != 1 || vols[0].Path != v.VolumePath || !slices.Equal(vols[0].SandboxIDs, ids) ||
				katatest.MustJSON(t, vols[0].MountInfo) != katatest.MustJSON(t, katatest.ReadBack[MountInfo](t, v)) {
				t.Errorf("List = %+v", vols)
			}
		})
	}
}

// TestVectorsCopyIsCurrent: the committed copy equals the shared one, when the shared tree is there.
func TestVectorsCopyIsCurrent(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatalf("no go.mod above %s", wd)
		}
		root = parent
	}
	shared := filepath.Join(root, "..", "shared")
	if _, err := os.Stat(shared); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s is absent", shared)
	}
	want, err := os.ReadFile(filepath.Join(shared, "compat", filepath.Base(katatest.VectorsFile)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(katatest.VectorsJSON, want) {
		t.Fatalf("%s differs from %s/compat: copy it again", katatest.VectorsFile, shared)
	}
}
