package kata

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"crust.dev/crust/api/kata/katatest"
)

const (
	testPath = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount"
	testInfo = `{"volume-type":"directvol","device":"/dev/loop0","fstype":"ext4"}`
)

func TestAddRefusesBadInputAndCreatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name, path, info string
		want             error
	}{
		{"empty json", testPath, "", ErrInvalidMountInfo},
		{"not json", testPath, "{", ErrInvalidMountInfo},
		{"wrong type", testPath, `{"device":7}`, ErrInvalidMountInfo},
		{"not an object", testPath, `[]`, ErrInvalidMountInfo},
		{"empty path", "", testInfo, ErrInvalidVolumePath},
		{"long path", "/" + strings.Repeat("a", MaxVolumePathLen), testInfo, ErrInvalidVolumePath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "kata")
			if err := Add(dir, tc.path, tc.info); !errors.Is(err, tc.want) {
				t.Fatalf("Add = %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("Add created %s: %v", dir, err)
			}
		})
	}
}

func TestLongestPathFits(t *testing.T) {
	dir := t.TempDir()
	p := "/" + strings.Repeat("a", MaxVolumePathLen-1)
	if err := Add(dir, p, testInfo); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(dir, p); err != nil {
		t.Fatal(err)
	}
}

func TestAddReplacesAndKeepsSandboxes(t *testing.T) {
	dir := t.TempDir()
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	if err := katatest.RecordSandbox(dir, testPath, "sb1"); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, VolumeDirName(testPath), MountInfoFileName)
	before, _ := os.Stat(name)

	// Same content: the file is left alone (same inode).
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(name); !os.SameFile(before, after) {
		t.Error("adding the same mount info rewrote the file")
	}

	next := `{"volume-type":"directvol","device":"/dev/loop1","fstype":"xfs","options":["ro"]}`
	if err := Add(dir, testPath, next); err != nil {
		t.Fatal(err)
	}
	assertVolumeDir(t, dir, VolumeDirName(testPath), map[string]string{MountInfoFileName: next, "sb1": ""})
	info, err := Get(dir, testPath)
	if err != nil || info.Device != "/dev/loop1" || !slices.Equal(info.Options, []string{"ro"}) {
		t.Fatalf("Get = %+v, %v", info, err)
	}
}

func TestAddOverAFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, VolumeDirName(testPath)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Add(dir, testPath, testInfo); !errors.Is(err, ErrForeignEntry) || !strings.Contains(err.Error(), "a regular file") {
		t.Fatalf("Add = %v", err)
	}
}

func TestAddIntoEmptyVolumeDir(t *testing.T) {
	// What Kata's own add leaves when it stops between creating the directory and writing the file.
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, VolumeDirName(testPath)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	assertVolumeDir(t, dir, VolumeDirName(testPath), map[string]string{MountInfoFileName: testInfo})
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	if err := Remove(dir, testPath); err != nil {
		t.Fatalf("removing a missing volume: %v", err)
	}
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	if err := katatest.RecordSandbox(dir, testPath, "sb1"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := Remove(dir, testPath); err != nil {
			t.Fatal(err)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != TempDirName {
			t.Errorf("left %s", e.Name())
		}
	}
	if left, _ := os.ReadDir(filepath.Join(dir, TempDirName)); len(left) != 0 {
		t.Errorf("left in the temporary directory: %v", left)
	}
	if _, err := Get(dir, testPath); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Remove = %v", err)
	}
	if err := Remove(dir, ""); !errors.Is(err, ErrInvalidVolumePath) {
		t.Fatalf("Remove(\"\") = %v", err)
	}
}

func TestGetAndSandboxIDsOfMissingVolume(t *testing.T) {
	dir := t.TempDir()
	if _, err := Get(dir, testPath); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get = %v", err)
	}
	if _, err := SandboxIDs(dir, testPath); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SandboxIDs = %v", err)
	}
	// A volume directory without mountInfo.json is no volume for Get, but Kata still reads its entries.
	volDir := filepath.Join(dir, VolumeDirName(testPath))
	if err := os.Mkdir(volDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(dir, testPath); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get = %v", err)
	}
	if ids, err := SandboxIDs(dir, testPath); err != nil || len(ids) != 0 {
		t.Fatalf("SandboxIDs = %v, %v", ids, err)
	}
}

func TestGetInvalidFile(t *testing.T) {
	dir := t.TempDir()
	volDir := filepath.Join(dir, VolumeDirName(testPath))
	if err := os.Mkdir(volDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(volDir, MountInfoFileName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(dir, testPath); !errors.Is(err, ErrInvalidMountInfo) {
		t.Fatalf("Get = %v", err)
	}
}

func TestSandboxIDsAsKataReadsThem(t *testing.T) {
	dir := t.TempDir()
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"zz", "aa", "mm"} {
		if err := katatest.RecordSandbox(dir, testPath, id); err != nil {
			t.Fatal(err)
		}
	}
	// Any other entry counts too: Kata does not look at what it is.
	if err := os.Mkdir(filepath.Join(dir, VolumeDirName(testPath), "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	ids, err := SandboxIDs(dir, testPath)
	if err != nil || !slices.Equal(ids, []string{"aa", "mm", "sub", "zz"}) {
		t.Fatalf("SandboxIDs = %v, %v", ids, err)
	}
}

func TestListSkipsWhatIsNotAVolume(t *testing.T) {
	dir := t.TempDir()
	paths := []string{"/b", "/a", "relative"}
	for _, p := range paths {
		if err := Add(dir, p, testInfo); err != nil {
			t.Fatal(err)
		}
	}
	if err := katatest.RecordSandbox(dir, "/b", "sb"); err != nil {
		t.Fatal(err)
	}
	mk := func(name string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mk("not-base64!")              // not base64url
	mk("L2I")                      // unpadded
	mk("L2F=")                     // non-zero trailing bits
	mk(".hidden")                  // dot directory
	mk(VolumeDirName("/no-info"))  // no mountInfo.json
	mk(VolumeDirName("/bad-info")) // mountInfo.json does not decode
	_ = os.WriteFile(filepath.Join(dir, VolumeDirName("/bad-info"), MountInfoFileName), []byte("nope"), 0o600)
	_ = os.WriteFile(filepath.Join(dir, VolumeDirName("/file")), nil, 0o600) // a file, not a directory
	_ = os.WriteFile(filepath.Join(dir, TempDirName, "left-over"), nil, 0o600)

	vols, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vols {
		got = append(got, v.Path)
	}
	if !slices.Equal(got, []string{"/a", "/b", "relative"}) {
		t.Fatalf("List paths = %q", got)
	}
	if !slices.Equal(vols[1].SandboxIDs, []string{"sb"}) || vols[0].SandboxIDs != nil {
		t.Fatalf("sandbox ids: %+v", vols)
	}
	if vols[0].MountInfo.Device != "/dev/loop0" {
		t.Fatalf("mount info: %+v", vols[0])
	}

	if vols, err := List(filepath.Join(dir, "missing")); err != nil || len(vols) != 0 {
		t.Fatalf("List of a missing dir = %v, %v", vols, err)
	}
}

func TestCleanTemp(t *testing.T) {
	dir := t.TempDir()
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	// What a crash in the middle of Add or Remove leaves behind.
	left := filepath.Join(dir, TempDirName, "add-123")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, MountInfoFileName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(dir, testPath); err != nil {
		t.Fatalf("left-overs disturb reads: %v", err)
	}
	for range 2 {
		if err := CleanTemp(dir); err != nil {
			t.Fatal(err)
		}
	}
	if left, err := os.ReadDir(filepath.Join(dir, TempDirName)); err != nil || len(left) != 0 {
		t.Fatalf("temporary directory after CleanTemp: %v, %v; want it there and empty", left, err)
	}
	// And writing works again afterwards.
	if err := Add(dir, "/other", testInfo); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(dir, "/other"); err != nil {
		t.Fatal(err)
	}
}

func TestModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	if err := Add(dir, testPath, `{"device":"/dev/x"}`); err != nil { // the replace path
		t.Fatal(err)
	}
	assertVolumeDir(t, dir, VolumeDirName(testPath), map[string]string{MountInfoFileName: `{"device":"/dev/x"}`})
}

func TestTempDirIsNeverAVolume(t *testing.T) {
	if p, err := ParseVolumeDirName(TempDirName); err == nil {
		t.Fatalf("%s decodes to %q", TempDirName, p)
	}
}

func TestForgetSandbox(t *testing.T) {
	dir := t.TempDir()
	vp := "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount"
	if err := Add(dir, vp, `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4"}`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sb1", "sb2"} {
		if err := katatest.RecordSandbox(dir, vp, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a\x00b", MountInfoFileName, strings.Repeat("x", 256)} {
		if err := ForgetSandbox(dir, vp, bad); !errors.Is(err, ErrInvalidSandboxID) {
			t.Errorf("ForgetSandbox(%q): %v, want ErrInvalidSandboxID", bad, err)
		}
	}
	if err := ForgetSandbox(dir, vp, "sb1"); err != nil {
		t.Fatal(err)
	}
	if err := ForgetSandbox(dir, vp, "sb1"); err != nil {
		t.Fatalf("forgetting again: %v", err)
	}
	if ids, err := SandboxIDs(dir, vp); err != nil || len(ids) != 1 || ids[0] != "sb2" {
		t.Fatalf("sandbox ids: %v, %v", ids, err)
	}
	if _, err := Get(dir, vp); err != nil {
		t.Fatalf("the descriptor went with the sandbox id: %v", err)
	}
}

// Add into a volume directory that stands without its mountInfo.json (an interrupted removal, or one made
// by hand) writes the file there and keeps the sandbox-id file.
func TestAddWhereOnlyTheDirectoryIs(t *testing.T) {
	dir := t.TempDir()
	vol := filepath.Join(dir, VolumeDirName(testPath))
	if err := os.MkdirAll(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "sb1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Add(dir, testPath, testInfo); err != nil {
		t.Fatal(err)
	}
	if info, err := Get(dir, testPath); err != nil || info.Device != "/dev/loop0" {
		t.Fatalf("Get = %+v, %v; want the added mount info", info, err)
	}
	if ids, err := SandboxIDs(dir, testPath); err != nil || len(ids) != 1 || ids[0] != "sb1" {
		t.Fatalf("sandbox ids: %v, %v; want sb1 kept", ids, err)
	}
	if left, err := os.ReadDir(filepath.Join(dir, TempDirName)); err != nil || len(left) != 0 {
		t.Fatalf("temporary directory: %v, %v; want it empty", left, err)
	}
}

// An opened Dir keeps its temporary directory between calls; one that somebody removed, or replaced with
// a file, is made anew, and the calls succeed as if nothing had happened. The same holds with
// WithoutSync, whose writes are the same files.
func TestKeptTempDirGoneMeanwhile(t *testing.T) {
	for _, opts := range [][]Option{nil, {WithoutSync()}} {
		dir := t.TempDir()
		d, err := OpenDir(dir, opts...)
		if err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, TempDirName)
		steps := []func(){
			func() {}, // the first call makes it
			func() { _ = os.RemoveAll(tmp) },
			func() { _ = os.RemoveAll(tmp); _ = os.WriteFile(tmp, nil, 0o600) },
		}
		for i, damage := range steps {
			damage()
			p := testPath + string(rune('a'+i))
			if err := d.Add(p, testInfo); err != nil {
				t.Fatalf("step %d, with options %d: Add: %v", i, len(opts), err)
			}
			if mi, err := Get(dir, p); err != nil || mi.Device != "/dev/loop0" {
				t.Fatalf("step %d: Get = %+v, %v", i, mi, err)
			}
			damage()
			if err := d.Add(p, strings.Replace(testInfo, "loop0", "loop1", 1)); err != nil {
				t.Fatalf("step %d: Add over an existing volume: %v", i, err)
			}
			if mi, err := Get(dir, p); err != nil || mi.Device != "/dev/loop1" {
				t.Fatalf("step %d: Get after the second Add = %+v, %v", i, mi, err)
			}
			damage()
			if err := d.Remove(p); err != nil {
				t.Fatalf("step %d: Remove: %v", i, err)
			}
			if _, err := Get(dir, p); !errors.Is(err, ErrNotFound) {
				t.Fatalf("step %d: Get after Remove = %v", i, err)
			}
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
