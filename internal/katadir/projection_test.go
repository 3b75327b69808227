package katadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
)

const target = "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount"

func volume(mod func(*crustv1.VolumeSpec)) *crustv1.Volume {
	s := &crustv1.VolumeSpec{
		VolumeTargetPath:  target,
		VolumeBackingPath: "/dev/loop3",
		VolumeType:        crustv1.VolumeType_VOLUME_TYPE_BLOCK,
		FsType:            "ext4",
	}
	if mod != nil {
		mod(s)
	}
	return &crustv1.Volume{Spec: s, ResolvedBackingPath: s.VolumeBackingPath}
}

// The projection names the device as crustd resolved and checked it at stage time, not the path as
// given, whose links could point elsewhere by the time Kata reads it.
func TestMountInfoResolvedDevice(t *testing.T) {
	v := volume(func(s *crustv1.VolumeSpec) { s.VolumeBackingPath = "/dev/vg0/lv0" })
	v.ResolvedBackingPath = "/dev/dm-3"
	if got := MountInfo(v).Device; got != "/dev/dm-3" {
		t.Fatalf("device %q, want the resolved /dev/dm-3", got)
	}
}

func newProjection(t *testing.T) *Projection {
	t.Helper()
	p, err := New(filepath.Join(t.TempDir(), "direct-volumes"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func readMountInfo(t *testing.T, dir, target string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, kata.VolumeDirName(target), kata.MountInfoFileName))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMountInfoMapping: each spec field lands where Kata reads it. (TestWriteIsWhatKataAddWrites shows
// that Write puts exactly this encoding in mountInfo.json.)
func TestMountInfoMapping(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*crustv1.VolumeSpec)
		want string
	}{
		{"minimal", nil,
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4"}`},
		{"image file", func(s *crustv1.VolumeSpec) {
			s.VolumeType, s.VolumeBackingPath = crustv1.VolumeType_VOLUME_TYPE_FILE, "/var/lib/images/a.img"
		}, `{"volume-type":"directvol","device":"/var/lib/images/a.img","fstype":"ext4"}`},
		{"pmem", func(s *crustv1.VolumeSpec) {
			s.VolumeType, s.VolumeBackingPath, s.FsType = crustv1.VolumeType_VOLUME_TYPE_PMEM, "/dev/pmem0", "xfs"
			s.MountFlags = []string{"dax"}
		}, `{"volume-type":"directvol","device":"/dev/pmem0","fstype":"xfs","options":["dax"]}`},
		{"mount flags in order", func(s *crustv1.VolumeSpec) { s.MountFlags = []string{"noatime", "discard"} },
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","options":["noatime","discard"]}`},
		{"read only adds ro", func(s *crustv1.VolumeSpec) { s.ReadOnly, s.MountFlags = true, []string{"noatime"} },
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","options":["noatime","ro"]}`},
		{"read only keeps one ro", func(s *crustv1.VolumeSpec) { s.ReadOnly, s.MountFlags = true, []string{"ro", "noatime"} },
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","options":["ro","noatime"]}`},
		{"fs group, policy unspecified", func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = proto.Int64(2000) },
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","metadata":{"fsGroup":"2000","fsGroupChangePolicy":"Always"}}`},
		{"fs group zero", func(s *crustv1.VolumeSpec) {
			s.VolumeSupplementalGroup = proto.Int64(0)
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS
		}, `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","metadata":{"fsGroup":"0","fsGroupChangePolicy":"Always"}}`},
		{"fs group on root mismatch", func(s *crustv1.VolumeSpec) {
			s.VolumeSupplementalGroup = proto.Int64(4059)
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH
		}, `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","metadata":{"fsGroup":"4059","fsGroupChangePolicy":"OnRootMismatch"}}`},
		{"policy without group is left out", func(s *crustv1.VolumeSpec) {
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH
		}, `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4"}`},
		{"create filesystem", func(s *crustv1.VolumeSpec) { s.CreateFilesystem = true },
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","metadata":{"createFilesystem":"true"}}`},
		{"metadata pairs", func(s *crustv1.VolumeSpec) { s.Metadata = map[string]string{"encryptionKey": "ephemeral", "b": "2"} },
			`{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","metadata":{"b":"2","encryptionKey":"ephemeral"}}`},
		{"typed fields win over metadata", func(s *crustv1.VolumeSpec) {
			s.Metadata = map[string]string{"fsGroup": "1", "createFilesystem": "false"}
			s.VolumeSupplementalGroup, s.CreateFilesystem = proto.Int64(7), true
		}, `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4","metadata":{"createFilesystem":"true","fsGroup":"7","fsGroupChangePolicy":"Always"}}`},
		{"operator fields are not projected", func(s *crustv1.VolumeSpec) {
			s.VolumeId, s.CsiDriver, s.PodUid = "vol-1", "example.csi", "uid"
		}, `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := volume(tc.mod)
			spec := v.Spec
			before := proto.Clone(spec)
			got, err := json.Marshal(MountInfo(v))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("mountInfo.json\n got %s\nwant %s", got, tc.want)
			}
			if !proto.Equal(spec, before) {
				t.Error("MountInfo changed the spec")
			}
		})
	}
}

// TestWriteIsWhatKataAddWrites: the projection of a descriptor is the directory api/kata.Add lays down
// for the equivalent mount info, file for file and mode for mode.
func TestWriteIsWhatKataAddWrites(t *testing.T) {
	v := volume(func(s *crustv1.VolumeSpec) {
		s.ReadOnly, s.MountFlags = true, []string{"noatime"}
		s.VolumeSupplementalGroup = proto.Int64(1000)
		s.CreateFilesystem = true
	})
	p := newProjection(t)
	if err := p.Write(v); err != nil {
		t.Fatal(err)
	}
	equivalent := `{"volume-type":"directvol","device":"/dev/loop3","fstype":"ext4",` +
		`"metadata":{"createFilesystem":"true","fsGroup":"1000","fsGroupChangePolicy":"Always"},"options":["noatime","ro"]}`
	other := t.TempDir()
	if err := kata.Add(other, target, equivalent); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, p.Dir()), tree(t, other); !slices.Equal(got, want) {
		t.Fatalf("projection\n%s\npkg/kata.Add\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// tree lists every path under dir with its mode and, for files, its content.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		line := fmt.Sprintf("%s %v", rel, fi.Mode())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWriteKeepsSandboxesAndIsIdempotent(t *testing.T) {
	p := newProjection(t)
	v := volume(nil)
	if err := p.Write(v); err != nil {
		t.Fatal(err)
	}
	if err := katatest.RecordSandbox(p.Dir(), target, "sandbox-1"); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(p.Dir(), kata.VolumeDirName(target), kata.MountInfoFileName)
	before, _ := os.Stat(name)
	if err := p.Write(v); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(name); !os.SameFile(before, after) {
		t.Error("writing the same descriptor again rewrote mountInfo.json")
	}
	if err := p.Write(volume(func(s *crustv1.VolumeSpec) { s.FsType = "xfs" })); err != nil {
		t.Fatal(err)
	}
	if got := readMountInfo(t, p.Dir(), target); !strings.Contains(got, `"fstype":"xfs"`) {
		t.Fatalf("not rewritten: %s", got)
	}
	ids, _, err := p.SandboxIDs(target)
	if err != nil || !slices.Equal(ids, []string{"sandbox-1"}) {
		t.Fatalf("SandboxIDs = %v, %v", ids, err)
	}
}

// TestOnlyKataFilesEverAppear watches a volume directory and the Kata directory through many writes and a
// sync: nothing but mountInfo.json and the sandbox-id file is ever created in the volume directory, and
// nothing but volume directories and the temporary directory in the Kata directory.
func TestOnlyKataFilesEverAppear(t *testing.T) {
	p := newProjection(t)
	if err := p.Write(volume(nil)); err != nil {
		t.Fatal(err)
	}
	volDir := filepath.Join(p.Dir(), kata.VolumeDirName(target))
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	for _, d := range []string{p.Dir(), volDir} {
		if err := w.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	appeared := make(chan string, 1000)
	go func() {
		for ev := range w.Events {
			if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Write) {
				appeared <- ev.Name
			}
		}
	}()

	if err := katatest.RecordSandbox(p.Dir(), target, "sb"); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		v := volume(func(s *crustv1.VolumeSpec) { s.MountFlags = []string{fmt.Sprintf("commit=%d", i)} })
		if err := p.Write(v); err != nil {
			t.Fatal(err)
		}
	}
	other := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = "/other" })
	if failed, err := p.Sync([]*crustv1.Volume{volume(nil), other}, nil); failed != nil || err != nil {
		t.Fatal(failed, err)
	}

	allowed := map[string]bool{
		volDir:                                   true,
		filepath.Join(p.Dir(), kata.TempDirName): true,
		filepath.Join(p.Dir(), kata.VolumeDirName("/other")): true,
		filepath.Join(volDir, kata.MountInfoFileName):        true,
		filepath.Join(volDir, "sb"):                          true,
	}
	// Read until the events stop; the watch must at least have seen the renames this test is about.
	seen := map[string]bool{}
	for done := false; !done; {
		select {
		case name := <-appeared:
			seen[name] = true
			if !allowed[name] {
				t.Errorf("%s appeared", name)
			}
		case <-time.After(300 * time.Millisecond):
			done = true
		}
	}
	for _, name := range []string{filepath.Join(volDir, kata.MountInfoFileName), filepath.Join(p.Dir(), kata.VolumeDirName("/other"))} {
		if !seen[name] {
			t.Errorf("the watch did not see %s appear", name)
		}
	}
}

func TestRemove(t *testing.T) {
	p := newProjection(t)
	if err := p.Remove(target); err != nil {
		t.Fatalf("removing what is not there: %v", err)
	}
	if err := p.Write(volume(nil)); err != nil {
		t.Fatal(err)
	}
	if err := katatest.RecordSandbox(p.Dir(), target, "sb"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Remove(target); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(p.Dir(), kata.VolumeDirName(target))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("volume directory still there: %v", err)
	}
}

func TestSandboxIDs(t *testing.T) {
	p := newProjection(t)
	if _, _, err := p.SandboxIDs(target); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("SandboxIDs of nothing = %v", err)
	}
	if err := p.Write(volume(nil)); err != nil {
		t.Fatal(err)
	}
	if ids, bad, err := p.SandboxIDs(target); err != nil || len(ids) != 0 || len(bad) != 0 {
		t.Fatalf("SandboxIDs = %v, %v, %v", ids, bad, err)
	}
	for _, id := range []string{"b", "a"} {
		if err := katatest.RecordSandbox(p.Dir(), target, id); err != nil {
			t.Fatal(err)
		}
	}
	// Names that are not UTF-8 come apart, never as sandbox ids, wherever they sort.
	for _, name := range []string{"\xff", "0\x80", "a\xc3"} {
		if err := os.WriteFile(filepath.Join(p.Dir(), kata.VolumeDirName(target), name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ids, bad, err := p.SandboxIDs(target)
	if err != nil || !slices.Equal(ids, []string{"a", "b"}) || !slices.Equal(bad, []string{"0\x80", "a\xc3", "\xff"}) {
		t.Fatalf("SandboxIDs = %q, %q, %v", ids, bad, err)
	}
}

// TestWriteOverAFileIsFailedPrecondition: something other than a directory where the volume directory
// belongs is a state conflict, left as it is.
func TestWriteOverAFileIsFailedPrecondition(t *testing.T) {
	p := newProjection(t)
	file := filepath.Join(p.Dir(), kata.VolumeDirName(target))
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Write(volume(nil)); !errors.Is(err, errdefs.ErrFailedPrecondition) || Kind(err) != crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY {
		t.Fatalf("Write over a file = %v, want FailedPrecondition", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "x" {
		t.Fatalf("the file was touched: %q, %v", b, err)
	}
	if _, _, err := p.SandboxIDs(target); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("SandboxIDs of a file = %v, want FailedPrecondition", err)
	}
}

func TestSync(t *testing.T) {
	p := newProjection(t)
	unchanged := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = "/t/unchanged" })
	changed := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = "/t/changed" })
	missing := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = "/t/missing" })
	both := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = "/t/both" })
	for _, v := range []*crustv1.Volume{unchanged, changed, both} {
		if err := p.Write(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := katatest.RecordSandbox(p.Dir(), "/t/changed", "sb-changed"); err != nil {
		t.Fatal(err)
	}
	// Projected by a crustd of an earlier boot, with a Kata sandbox.
	if err := kata.Add(p.Dir(), "/t/dropped", `{"volume-type":"directvol","device":"/dev/x","fstype":"ext4"}`); err != nil {
		t.Fatal(err)
	}
	if err := katatest.RecordSandbox(p.Dir(), "/t/dropped", "sb-dropped"); err != nil {
		t.Fatal(err)
	}
	// Added by someone else with kata-runtime direct-volume add.
	foreign := `{"volume-type":"block","device":"/dev/y","fstype":"xfs"}`
	if err := kata.Add(p.Dir(), "/t/foreign", foreign); err != nil {
		t.Fatal(err)
	}
	// Left by a crash in the middle of a write.
	leftover := filepath.Join(p.Dir(), kata.TempDirName, "add-1")
	if err := os.MkdirAll(leftover, 0o700); err != nil {
		t.Fatal(err)
	}

	changed.Spec.FsType = "xfs"
	name := func(target string) string {
		return filepath.Join(p.Dir(), kata.VolumeDirName(target), kata.MountInfoFileName)
	}
	// A regular file where one volume's directory belongs: Sync goes on. A target Kata cannot name is no
	// failure: it is left out.
	if err := os.WriteFile(filepath.Join(p.Dir(), kata.VolumeDirName("/t/file")), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	file := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = "/t/file" })
	long := volume(func(s *crustv1.VolumeSpec) {
		s.VolumeTargetPath = "/t/" + strings.Repeat("l", kata.MaxVolumePathLen)
	})

	before, _ := os.Stat(name("/t/unchanged"))
	failed, err := p.Sync([]*crustv1.Volume{unchanged, file, changed, long, missing, both}, []string{"/t/dropped", "/t/both", "/t/never"})
	if err != nil || len(failed) != 1 || Kind(failed["/t/file"]) != crustv1.ProblemKind_PROBLEM_KIND_KATA_FOREIGN_ENTRY {
		t.Fatalf("Sync = %v, %v; want the file reported, and only the file", failed, err)
	}

	if after, _ := os.Stat(name("/t/unchanged")); !os.SameFile(before, after) {
		t.Error("an unchanged projection was rewritten")
	}
	for _, v := range []*crustv1.Volume{unchanged, changed, missing, both} {
		want, _ := json.Marshal(MountInfo(v))
		if got := readMountInfo(t, p.Dir(), v.Spec.VolumeTargetPath); got != string(want) {
			t.Errorf("%s: %s, want %s", v.Spec.VolumeTargetPath, got, want)
		}
	}
	if ids, _, _ := p.SandboxIDs("/t/changed"); !slices.Equal(ids, []string{"sb-changed"}) {
		t.Errorf("sandbox of a rewritten projection: %v", ids)
	}
	if _, err := os.Stat(filepath.Join(p.Dir(), kata.VolumeDirName("/t/dropped"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dropped projection still there: %v", err)
	}
	if got := readMountInfo(t, p.Dir(), "/t/foreign"); got != foreign {
		t.Errorf("foreign volume touched: %s", got)
	}
	if left, _ := os.ReadDir(filepath.Join(p.Dir(), kata.TempDirName)); len(left) != 0 {
		t.Errorf("temporary directory not cleaned: %v", left)
	}
}

func TestBadInput(t *testing.T) {
	p := newProjection(t)
	for name, v := range map[string]*crustv1.Volume{"nil": nil, "no spec": {}} {
		var fe *errdefs.FieldError
		if err := p.Write(v); !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &fe) || fe.Field != "spec" {
			t.Errorf("%s: Write = %v, want a spec field error", name, err)
		}
	}
	if entries, _ := os.ReadDir(p.Dir()); len(entries) != 0 {
		t.Errorf("refused writes left %v", entries)
	}
}

// kubeletTarget is kubelet's target path of a CSI volume of pod uid for the PersistentVolume pv.
func kubeletTarget(uid, pv string) string {
	return "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/" + pv + "/mount"
}

// TestTargetKataCannotName: a PersistentVolume's name may be 253 characters, and kubelet's target path of
// such a volume is longer than the 189 bytes whose base64url form fits in a file name. The projection
// leaves it out, without an error (Write, Sync, Remove, SandboxIDs and ForgetSandbox all take it), writes
// nothing for it, and its Kata caveats say why Kata will not find it; a target of an ordinary name is
// still projected, without that caveat.
func TestTargetKataCannotName(t *testing.T) {
	const uid = "0e0e0e0e-0000-4000-8000-000000000001"
	p := newProjection(t)
	long := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = kubeletTarget(uid, strings.Repeat("p", 253)) })
	short := volume(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = kubeletTarget(uid, "pvc-0123") })
	longTarget, shortTarget := long.GetSpec().GetVolumeTargetPath(), short.GetSpec().GetVolumeTargetPath()
	if len(longTarget) <= kata.MaxVolumePathLen || Nameable(longTarget) || Projects(long.GetSpec()) {
		t.Fatalf("a %d-byte target path is nameable", len(longTarget))
	}
	if !Nameable(shortTarget) || !Projects(short.GetSpec()) {
		t.Fatalf("a %d-byte target path is not nameable", len(shortTarget))
	}

	if err := p.Write(long); err != nil {
		t.Fatalf("Write of a target Kata cannot name = %v, want nil", err)
	}
	if err := p.Write(short); err != nil {
		t.Fatal(err)
	}
	if failed, err := p.Sync([]*crustv1.Volume{long, short}, []string{longTarget}); failed != nil || err != nil {
		t.Fatalf("Sync = %v, %v", failed, err)
	}
	entries, err := os.ReadDir(p.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != kata.TempDirName {
			names = append(names, e.Name())
		}
	}
	if want := []string{kata.VolumeDirName(shortTarget)}; !slices.Equal(names, want) {
		t.Fatalf("the projection holds %q, want only the short target's %q", names, want)
	}
	want, _ := json.Marshal(MountInfo(short))
	if got := readMountInfo(t, p.Dir(), shortTarget); got != string(want) {
		t.Errorf("short target: %s, want %s", got, want)
	}

	if ids, bad, err := p.SandboxIDs(longTarget); ids != nil || bad != nil || err != nil {
		t.Errorf("SandboxIDs = %v, %v, %v; want nothing", ids, bad, err)
	}
	if err := p.ForgetSandbox(longTarget, "sb"); err != nil {
		t.Errorf("ForgetSandbox = %v", err)
	}
	if err := p.Remove(longTarget); err != nil {
		t.Errorf("Remove = %v", err)
	}

	if c := Caveats(long); !slices.Equal(c, []string{PathTooLongCaveat}) {
		t.Errorf("caveats of the long target: %q, want the path caveat alone", c)
	}
	if c := Caveats(short); len(c) != 0 {
		t.Errorf("caveats of the short target: %q, want none", c)
	}
	if !strings.Contains(PathTooLongCaveat, strconv.Itoa(kata.MaxVolumePathLen)+" bytes") {
		t.Errorf("the caveat does not name the limit, %d bytes: %s", kata.MaxVolumePathLen, PathTooLongCaveat)
	}
}

func TestDisabled(t *testing.T) {
	p, err := New("")
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() || p.Dir() != "" {
		t.Fatal("enabled")
	}
	if err := p.Write(volume(nil)); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(target); err != nil {
		t.Fatal(err)
	}
	if ids, _, err := p.SandboxIDs(target); err != nil || ids != nil {
		t.Fatalf("SandboxIDs = %v, %v", ids, err)
	}
	if failed, err := p.Sync([]*crustv1.Volume{volume(nil)}, []string{target}); failed != nil || err != nil {
		t.Fatal(failed, err)
	}
}

func TestNewCreatesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	p, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || !p.Enabled() {
		t.Fatalf("dir %v, %v", fi, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(file); err == nil {
		t.Fatal("New over a file succeeded")
	}
}
