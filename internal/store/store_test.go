package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/internal/recordfile/recordfiletest"
)

const (
	bootA = "0b5a1e6c-7d0e-4f53-9a43-1f2d3c4b5a61"
	bootB = "9f8e7d6c-5b4a-4392-8170-6e5d4c3b2a19"
)

// vol returns a small volume for target.
func vol(target string) *crustv1.Volume {
	return &crustv1.Volume{
		Spec: &crustv1.VolumeSpec{
			VolumeTargetPath:  target,
			VolumeBackingPath: "/dev/loop7",
			FsType:            "ext4",
		},
		ResolvedBackingPath: "/dev/loop7",
		DeviceNumber:        &crustv1.DeviceNumber{Major: 7, Minor: 7},
	}
}

// fullVol returns a volume with every field set.
func fullVol(target string) *crustv1.Volume {
	group := int64(2000)
	return &crustv1.Volume{
		Spec: &crustv1.VolumeSpec{
			VolumeTargetPath:              target,
			VolumeBackingPath:             "/dev/disk/by-id/virtio-vol1",
			VolumeType:                    crustv1.VolumeType_VOLUME_TYPE_BLOCK,
			FsType:                        "xfs",
			MountFlags:                    []string{"noatime", "nodiscard"},
			ReadOnly:                      true,
			VolumeSupplementalGroup:       &group,
			SupplementalGroupChangePolicy: crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH,
			CreateFilesystem:              true,
			VolumeId:                      "pvc-0d6c",
			CsiDriver:                     "hostpath.csi.k8s.io",
			PodUid:                        "6f1c7c2e-1c1f-4a3e-9d55-0c8a3f1e2b7d",
			Metadata:                      map[string]string{"b": "2", "a": "1", "ünï": "cödé \"quoted\"\n"},
		},
		ResolvedBackingPath: "/dev/vdb",
		DeviceNumber:        &crustv1.DeviceNumber{Major: 254, Minor: 16, Inode: 0},
		StageTime:           timestamppb.New(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)),
		Claim: &crustv1.Claim{
			SandboxId:       "sb-1",
			HandlerEndpoint: "unix:///run/handler.sock",
			ClaimTime:       timestamppb.New(time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC)),
			Kata:            true,
		},
	}
}

// longTarget is longer than NAME_MAX (255), which is why file names are hashes.
var longTarget = "/var/lib/kubelet/pods/" + strings.Repeat("x", 300) + "/volumes/kubernetes.io~csi/pv/mount"

func testLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func mustOpen(t *testing.T, dir, boot string) (*Store, *LoadReport) {
	t.Helper()
	return mustOpenWith(t, dir, boot, Options{})
}

// mustOpenWith is mustOpen with opt, its Log replaced by the test's.
func mustOpenWith(t *testing.T, dir, boot string, opt Options) (*Store, *LoadReport) {
	t.Helper()
	var logs bytes.Buffer
	opt.Log = testLogger(&logs)
	s, r, err := reopen(t, dir, boot, opt)
	if err != nil {
		t.Fatalf("Open: %v\nlogs:\n%s", err, logs.String())
	}
	return s, r
}

// opened holds, by directory, the store reopen last opened there.
var opened sync.Map

// reopen is OpenWith as a restarted crustd calls it: the store reopen last opened on dir is closed first
// (its process has ended, and its lock with it), and the new one when t ends.
func reopen(t testing.TB, dir, boot string, opt Options) (*Store, *LoadReport, error) {
	if prev, ok := opened.LoadAndDelete(dir); ok {
		prev.(*Store).Close()
	}
	s, r, err := OpenWith(dir, boot, opt)
	if err == nil {
		opened.Store(dir, s)
		t.Cleanup(s.Close)
	}
	return s, r, err
}

func mustPut(t *testing.T, s *Store, vs ...*crustv1.Volume) {
	t.Helper()
	for _, v := range vs {
		if err := s.Put(v); err != nil {
			t.Fatalf("Put(%q): %v", v.GetSpec().GetVolumeTargetPath(), err)
		}
	}
}

func targets(vs []*crustv1.Volume) []string {
	var ts []string
	for _, v := range vs {
		ts = append(ts, v.GetSpec().GetVolumeTargetPath())
	}
	return ts
}

func recordPath(dir, target string) string {
	sum := sha256.Sum256([]byte(target))
	return filepath.Join(dir, "volumes", hex.EncodeToString(sum[:])+".json")
}

// rawRecord builds a record by the documented format, independently of encodeRecord.
func rawRecord(version int, bootID string, payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return fmt.Appendf(nil, `{"version":%d,"bootId":%q,"sha256":"%x","volume":%s}`+"\n", version, bootID, sum, payload)
}

// payloadOf is the payload of v in record version 2.
func payloadOf(t *testing.T, v *crustv1.Volume) []byte {
	t.Helper()
	bin, err := proto.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64Payload(bin)
}

// base64Payload is a version 2 payload holding bin: a JSON string of its standard base64, as documented.
func base64Payload(bin []byte) []byte {
	return fmt.Appendf(nil, "%q", base64.StdEncoding.EncodeToString(bin))
}

// payloadV1Of is the payload of v in record version 1, as crustd wrote it before version 2.
func payloadV1Of(t *testing.T, v *crustv1.Volume) []byte {
	t.Helper()
	b, err := protojson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readDirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		vols []*crustv1.Volume
	}{
		{"minimal", []*crustv1.Volume{vol("/k/pods/a/mount")}},
		{"every field", []*crustv1.Volume{fullVol("/k/pods/b/mount")}},
		{"target longer than NAME_MAX", []*crustv1.Volume{vol(longTarget)}},
		{"unicode and odd bytes in target", []*crustv1.Volume{vol("/k/pods/ü n\ti\"c\\o/d\u2028e")}},
		{"several", []*crustv1.Volume{vol("/k/3"), fullVol("/k/1"), vol("/k/2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, r := mustOpen(t, dir, bootA)
			if len(r.Volumes)+len(r.Dropped)+len(r.Corrupt) != 0 {
				t.Fatalf("fresh store reported %+v", r)
			}
			mustPut(t, s, tc.vols...)

			_, r = mustOpen(t, dir, bootA)
			if len(r.Dropped)+len(r.Corrupt) != 0 {
				t.Fatalf("Dropped %v, Corrupt %v; want none", r.Dropped, r.Corrupt)
			}
			want := slices.Clone(tc.vols)
			slices.SortFunc(want, func(a, b *crustv1.Volume) int {
				return strings.Compare(a.GetSpec().GetVolumeTargetPath(), b.GetSpec().GetVolumeTargetPath())
			})
			if len(r.Volumes) != len(want) {
				t.Fatalf("loaded %v, want %v", targets(r.Volumes), targets(want))
			}
			for i := range want {
				if !proto.Equal(r.Volumes[i], want[i]) {
					t.Errorf("volume %d:\n got %v\nwant %v", i, r.Volumes[i], want[i])
				}
			}
		})
	}
}

// TestRecordFormat pins the documented on-disk format, in each version a store writes: by default the
// version the previous release reads.
func TestRecordFormat(t *testing.T) {
	for _, tc := range []struct {
		name         string
		writeVersion int // Options.WriteVersion
		want         int // the version in the file
	}{
		{"default", 0, 1},
		{"version 1", 1, 1},
		{"version 2", 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := mustOpenWith(t, dir, bootA, Options{WriteVersion: tc.writeVersion})
			v := fullVol("/k/pods/p/mount")
			mustPut(t, s, v)
			path := recordPath(dir, "/k/pods/p/mount")
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("record not at the documented path: %v", err)
			}
			prefix := fmt.Sprintf(`{"version":%d,"bootId":"%s","sha256":"`, tc.want, bootA)
			if !bytes.HasPrefix(data, []byte(prefix)) || !bytes.HasSuffix(data, []byte("}\n")) || bytes.Count(data, []byte("\n")) != 1 {
				t.Fatalf("record does not have the documented shape:\n%s", data)
			}
			rest := data[len(prefix):]
			sum, rest, ok := bytes.Cut(rest, []byte(`","volume":`))
			if !ok {
				t.Fatalf("no volume member after the checksum:\n%s", data)
			}
			payload := rest[:len(rest)-2]
			if got := sha256.Sum256(payload); hex.EncodeToString(got[:]) != string(sum) {
				t.Errorf("sha256 %s is not the checksum of the payload bytes", sum)
			}
			if got := documentedPayload(t, tc.want, payload); !proto.Equal(got, v) {
				t.Errorf("payload holds %v, want %v", got, v)
			}
		})
	}
}

// documentedPayload decodes a payload of the given version by the documented format: in version 1 the
// protojson encoding of the volume, in version 2 a JSON string of the standard base64, with padding, of
// its protobuf encoding.
func documentedPayload(t *testing.T, version int, payload []byte) *crustv1.Volume {
	t.Helper()
	got := &crustv1.Volume{}
	if version == 1 {
		if err := protojson.Unmarshal(payload, got); err != nil {
			t.Fatalf("payload is not the protojson of a volume: %v\n%s", err, payload)
		}
		return got
	}
	if len(payload) < 2 || payload[0] != '"' || payload[len(payload)-1] != '"' {
		t.Fatalf("payload is not a JSON string:\n%s", payload)
	}
	bin, err := base64.StdEncoding.DecodeString(string(payload[1 : len(payload)-1]))
	if err != nil {
		t.Fatalf("payload is not standard base64: %v\n%s", err, payload)
	}
	if err := proto.Unmarshal(bin, got); err != nil {
		t.Fatalf("payload is not the base64 of the protobuf encoding of a volume: %v\n%s", err, payload)
	}
	return got
}

// A store told to write an older version than some of its records rewrites, at Open, the records of this
// boot in that version, so that the previous release can start on them; a record of another boot is
// dropped as ever, and an older record is left as it is.
func TestOpenRewritesNewerRecords(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpenWith(t, dir, bootA, Options{WriteVersion: 2})
	a, b := fullVol("/k/pods/a/mount"), vol("/k/pods/b/mount")
	mustPut(t, s, a, b)
	_, r := mustOpen(t, dir, bootA)
	if len(r.Volumes) != 2 || !proto.Equal(r.Volumes[0], a) || !proto.Equal(r.Volumes[1], b) {
		t.Fatalf("loaded %v, want %v and %v", r.Volumes, a, b)
	}
	for _, v := range []*crustv1.Volume{a, b} {
		data, err := os.ReadFile(recordPath(dir, v.GetSpec().GetVolumeTargetPath()))
		if err != nil || !bytes.HasPrefix(data, []byte(`{"version":1,`)) {
			t.Fatalf("the record of %s after Open: %s, %v; want version 1", v.GetSpec().GetVolumeTargetPath(), data, err)
		}
	}
	// Told to write version 2 again, Open leaves version 1 records as they are: every release reads them.
	mustOpenWith(t, dir, bootA, Options{WriteVersion: 2})
	if data, err := os.ReadFile(recordPath(dir, "/k/pods/a/mount")); err != nil || !bytes.HasPrefix(data, []byte(`{"version":1,`)) {
		t.Fatalf("a version 1 record after Open writing version 2: %s, %v; want it untouched", data, err)
	}
}

// A write version the store does not write fails Open, naming it, before the directory is touched.
func TestOpenRefusesUnknownWriteVersion(t *testing.T) {
	for _, version := range []int{-1, NewestVersion + 1} {
		dir := filepath.Join(t.TempDir(), "state")
		_, _, err := OpenWith(dir, bootA, Options{WriteVersion: version})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprintf("write version %d", version)) {
			t.Errorf("WriteVersion %d: %v; want an invalid argument naming the write version", version, err)
		}
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("WriteVersion %d: the directory was made (%v)", version, err)
		}
	}
}

func TestPutIdempotentAndReplaces(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	const target = "/k/pods/a/mount"
	v1 := vol(target)
	v2 := fullVol(target)
	mustPut(t, s, v1, v1, v2, v2)
	if names := readDirNames(t, filepath.Join(dir, "volumes")); len(names) != 1 {
		t.Fatalf("volumes/ holds %v, want one record", names)
	}
	if names := readDirNames(t, filepath.Join(dir, "tmp")); len(names) != 0 {
		t.Fatalf("tmp/ holds %v after successful writes", names)
	}
	_, r := mustOpen(t, dir, bootA)
	if len(r.Volumes) != 1 || !proto.Equal(r.Volumes[0], v2) {
		t.Fatalf("loaded %v, want the last one put", r.Volumes)
	}
}

func TestPutRefuses(t *testing.T) {
	huge := vol("/k/huge")
	huge.Spec.Metadata = map[string]string{"x": strings.Repeat("y", recordfile.MaxSize)}
	for _, tc := range []struct {
		name string
		v    *crustv1.Volume
	}{
		{"nil volume", nil},
		{"no spec", &crustv1.Volume{}},
		{"empty target", vol("")},
		{"record over 1 MiB", huge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, bootA)
			if err := s.Put(tc.v); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Put: %v, want ErrInvalidArgument", err)
			}
			if names := readDirNames(t, filepath.Join(dir, "volumes")); len(names) != 0 {
				t.Fatalf("a refused Put left %v", names)
			}
		})
	}
}

func TestDelete(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	mustPut(t, s, vol("/k/a"), vol("/k/b"))
	for _, target := range []string{"/k/unknown", "/k/a", "/k/a", longTarget} {
		if err := s.Delete(target); err != nil {
			t.Fatalf("Delete(%q): %v", target, err)
		}
	}
	if err := s.Delete(""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf(`Delete(""): %v, want ErrInvalidArgument`, err)
	}
	_, r := mustOpen(t, dir, bootA)
	if got := targets(r.Volumes); !slices.Equal(got, []string{"/k/b"}) {
		t.Fatalf("loaded %v, want [/k/b]", got)
	}
}

func TestOpenSorts(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	in := []string{"/k/m", "/k/a", "/k/z/1", "/k/b", "/k/z", "/k/A"}
	for _, target := range in {
		mustPut(t, s, vol(target))
	}
	_, r := mustOpen(t, dir, bootA)
	want := slices.Sorted(slices.Values(in))
	if got := targets(r.Volumes); !slices.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
}

func TestOtherBootDropped(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	mustPut(t, s, vol("/k/z"), vol("/k/a"))

	s, r := mustOpen(t, dir, bootB)
	if len(r.Volumes) != 0 || len(r.Corrupt) != 0 {
		t.Fatalf("Volumes %v, Corrupt %v; want none", targets(r.Volumes), r.Corrupt)
	}
	if want := []string{"/k/a", "/k/z"}; !slices.Equal(r.Dropped, want) {
		t.Fatalf("Dropped %v, want %v", r.Dropped, want)
	}
	if names := readDirNames(t, filepath.Join(dir, "volumes")); len(names) != 0 {
		t.Fatalf("dropped records are still there: %v", names)
	}

	mustPut(t, s, vol("/k/new"))
	_, r = mustOpen(t, dir, bootB)
	if got := targets(r.Volumes); len(r.Dropped) != 0 || !slices.Equal(got, []string{"/k/new"}) {
		t.Fatalf("second Open: Volumes %v, Dropped %v", got, r.Dropped)
	}
}

func TestCorruptMovedAside(t *testing.T) {
	const target = "/k/pods/bad/mount"
	good := func(t *testing.T) []byte { return rawRecord(recordVersion, bootA, payloadOf(t, fullVol(target))) }
	for _, tc := range []struct {
		name   string
		reason string // in the warning
		// damage returns the file name in volumes/ and its content.
		damage func(t *testing.T) (string, []byte)
	}{
		{"truncated", "not a JSON record", func(t *testing.T) (string, []byte) {
			b := good(t)
			return filepath.Base(recordPath("", target)), b[:len(b)/2]
		}},
		{"flipped byte in payload", "checksum mismatch", func(t *testing.T) (string, []byte) {
			b := good(t)
			i := bytes.Index(b, []byte(`"volume":"`)) + len(`"volume":"`) + 10
			b[i] ^= 0x01
			return filepath.Base(recordPath("", target)), b
		}},
		{"flipped byte in checksum", "checksum mismatch", func(t *testing.T) (string, []byte) {
			b := good(t)
			i := bytes.Index(b, []byte(`"sha256":"`)) + len(`"sha256":"`)
			b[i] ^= 0x01
			return filepath.Base(recordPath("", target)), b
		}},
		{"bad JSON", "not a JSON record", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), []byte(`{"version":2,"bootId":`)
		}},
		{"trailing garbage", "not a JSON record", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), append(good(t), "{}"...)
		}},
		{"empty file", "not a JSON record", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), nil
		}},
		{"wrong file name", "file name does not match", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", "/k/pods/other/mount")), good(t)
		}},
		{"not a record name", "file name does not match", func(t *testing.T) (string, []byte) {
			return "stray.txt", good(t)
		}},
		{"version missing", "missing or invalid version 0", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), bytes.Replace(good(t), []byte(`"version":2,`), nil, 1)
		}},
		{"version zero", "missing or invalid version 0", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(0, bootA, payloadOf(t, vol(target)))
		}},
		{"empty bootId", "empty bootId", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(recordVersion, "", payloadOf(t, vol(target)))
		}},
		{"payload not a Volume, checksum valid", "bad volume", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(recordVersion, bootA, []byte(`"bm9wZQ=="`)) // "nope"
		}},
		{"payload not base64, checksum valid", "bad volume", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(recordVersion, bootA, []byte(`"no pe"`))
		}},
		{"payload not a string, checksum valid", "bad volume", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(recordVersion, bootA, payloadV1Of(t, vol(target)))
		}},
		{"version 1 payload not a Volume, checksum valid", "bad volume", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(1, bootA, []byte(`{"spec":"nope"}`))
		}},
		{"version 1 payload of version 2, checksum valid", "bad volume", func(t *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), rawRecord(1, bootA, payloadOf(t, vol(target)))
		}},
		{"empty target, checksum valid", "no target path", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", "")), rawRecord(recordVersion, bootA, []byte(`""`))
		}},
		{"over 1 MiB", "more than 1048576", func(_ *testing.T) (string, []byte) {
			return filepath.Base(recordPath("", target)), bytes.Repeat([]byte(" "), recordfile.MaxSize+1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, bootA)
			keep := vol("/k/good")
			mustPut(t, s, keep)
			name, data := tc.damage(t)
			writeFile(t, filepath.Join(dir, "volumes", name), data)

			var logs bytes.Buffer
			_, r, err := reopen(t, dir, bootA, Options{Log: testLogger(&logs)})
			if err != nil {
				t.Fatalf("Open failed on a damaged record: %v", err)
			}
			if len(r.Volumes) != 1 || !proto.Equal(r.Volumes[0], keep) || len(r.Dropped) != 0 {
				t.Fatalf("Volumes %v, Dropped %v; want only the good record", targets(r.Volumes), r.Dropped)
			}
			if len(r.Corrupt) != 1 {
				t.Fatalf("Corrupt %v, want one file", r.Corrupt)
			}
			moved := r.Corrupt[0]
			if filepath.Dir(moved) != filepath.Join(dir, "corrupt") || !strings.HasPrefix(filepath.Base(moved), name+".") {
				t.Errorf("moved to %s, want %s/corrupt/%s.<time>", moved, dir, name)
			}
			if got, err := os.ReadFile(moved); err != nil || !bytes.Equal(got, data) {
				t.Errorf("moved file does not hold the damaged bytes (err %v)", err)
			}
			if _, err := os.Stat(filepath.Join(dir, "volumes", name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("damaged file still in volumes/: %v", err)
			}
			if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, name) || !strings.Contains(l, tc.reason) {
				t.Errorf("no warning naming %s for %q; logs:\n%s", name, tc.reason, l)
			}
			// Once moved aside it is not reported again.
			_, r = mustOpen(t, dir, bootA)
			if len(r.Corrupt) != 0 || len(r.Volumes) != 1 {
				t.Errorf("second Open: Corrupt %v, Volumes %v", r.Corrupt, targets(r.Volumes))
			}
		})
	}
}

func TestNonRegularEntryMovedAside(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir, bootA)
	name := filepath.Base(recordPath("", "/k/dir"))
	if err := os.Mkdir(filepath.Join(dir, "volumes", name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "volumes", "link.json")); err != nil {
		t.Fatal(err)
	}
	_, r := mustOpen(t, dir, bootA)
	if len(r.Corrupt) != 2 || len(r.Volumes) != 0 {
		t.Fatalf("Corrupt %v, Volumes %v; want both entries moved aside", r.Corrupt, targets(r.Volumes))
	}
}

// Fields a newer crustd added within a record version are dropped, and the volume loads.
func TestUnknownFieldsIgnored(t *testing.T) {
	const target = "/k/future"
	bin, err := proto.Marshal(&crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: target, FsType: "ext4"}})
	if err != nil {
		t.Fatal(err)
	}
	bin = protowire.AppendTag(bin, 99, protowire.BytesType) // a field of a number Volume does not have
	bin = protowire.AppendBytes(bin, []byte("future"))
	for _, tc := range []struct {
		name   string
		record []byte
	}{
		{"version 1", rawRecord(1, bootA, []byte(`{"spec":{"volumeTargetPath":"/k/future","fsType":"ext4",`+
			`"volumeType":"VOLUME_TYPE_FROM_THE_FUTURE","futureField":{"x":[1,2]}},"futureTopLevel":true}`))},
		{"version 2", rawRecord(2, bootA, base64Payload(bin))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mustOpen(t, dir, bootA)
			writeFile(t, recordPath(dir, target), tc.record)
			_, r := mustOpen(t, dir, bootA)
			if len(r.Corrupt) != 0 || len(r.Volumes) != 1 {
				t.Fatalf("Corrupt %v, Volumes %v; want the record loaded", r.Corrupt, targets(r.Volumes))
			}
			got := r.Volumes[0]
			if got.GetSpec().GetVolumeTargetPath() != target || got.GetSpec().GetFsType() != "ext4" || len(got.ProtoReflect().GetUnknown()) != 0 {
				t.Fatalf("loaded %v (unknown bytes %q)", got, got.ProtoReflect().GetUnknown())
			}
		})
	}
}

// Records crustd wrote before version 2 (protojson payloads) load as they were, and a Put by a store
// writing version 2 writes the volume again in version 2.
func TestReadsVersion1(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir, bootA)
	v := fullVol("/k/pods/old/mount")
	writeFile(t, recordPath(dir, "/k/pods/old/mount"), rawRecord(1, bootA, payloadV1Of(t, v)))
	writeFile(t, recordPath(dir, "/k/pods/gone/mount"), rawRecord(1, bootB, payloadV1Of(t, vol("/k/pods/gone/mount"))))
	s, r := mustOpenWith(t, dir, bootA, Options{WriteVersion: 2})
	if len(r.Volumes) != 1 || !proto.Equal(r.Volumes[0], v) || !slices.Equal(r.Dropped, []string{"/k/pods/gone/mount"}) || len(r.Corrupt) != 0 {
		t.Fatalf("Volumes %v, Dropped %v, Corrupt %v; want the version 1 record loaded and the other boot's dropped",
			r.Volumes, r.Dropped, r.Corrupt)
	}
	mustPut(t, s, v)
	data, err := os.ReadFile(recordPath(dir, "/k/pods/old/mount"))
	if err != nil || !bytes.HasPrefix(data, []byte(`{"version":2,`)) {
		t.Fatalf("the record after a Put: %s, %v; want version 2", data, err)
	}
}

func TestNewerVersionRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record []byte
	}{
		{"version 3", rawRecord(3, bootA, []byte(`{"spec":{"volumeTargetPath":"/k/v3"}}`))},
		{"version 3 of another boot", rawRecord(3, bootB, []byte(`{"spec":{"volumeTargetPath":"/k/v3"}}`))},
		{"version 3 with an envelope version 2 cannot parse", []byte(`{"bootId":{"new":"shape"},"version":3,"volumes":[]}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := mustOpen(t, dir, bootA)
			mustPut(t, s, vol("/k/good"))
			writeFile(t, recordPath(dir, "/k/other-boot"), rawRecord(recordVersion, bootB, payloadOf(t, vol("/k/other-boot"))))
			writeFile(t, filepath.Join(dir, "volumes", "damaged.json"), []byte("garbage"))
			writeFile(t, filepath.Join(dir, "volumes", "zz.json"), tc.record)
			before := readDirNames(t, filepath.Join(dir, "volumes"))

			_, _, err := reopen(t, dir, bootA, Options{Log: testLogger(new(bytes.Buffer))})
			if err == nil {
				t.Fatal("Open succeeded over a record of a newer version")
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "zz.json") ||
				!strings.Contains(err.Error(), "version 3") {
				t.Errorf("error %q: want ErrFailedPrecondition naming the file and its version", err)
			}
			// Neither the record of another boot nor the damaged one was touched.
			if after := readDirNames(t, filepath.Join(dir, "volumes")); !slices.Equal(before, after) {
				t.Errorf("volumes/ changed from %v to %v", before, after)
			}
			if moved := readDirNames(t, filepath.Join(dir, "corrupt")); len(moved) != 0 {
				t.Errorf("corrupt/ holds %v; nothing may be moved", moved)
			}
		})
	}
}

func TestTempLeftoversRemoved(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	mustPut(t, s, vol("/k/a"))
	tmp := filepath.Join(dir, "tmp")
	writeFile(t, filepath.Join(tmp, ".abc.json12345"), []byte(`{"version":1,"boo`))
	if err := os.MkdirAll(filepath.Join(tmp, "d", "e"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(tmp, "d", "e", "f"), nil)

	s, r := mustOpen(t, dir, bootA)
	if names := readDirNames(t, tmp); len(names) != 0 {
		t.Fatalf("tmp/ still holds %v", names)
	}
	if len(r.Volumes) != 1 || len(r.Corrupt) != 0 {
		t.Fatalf("Volumes %v, Corrupt %v", targets(r.Volumes), r.Corrupt)
	}
	mustPut(t, s, vol("/k/b"))
}

func TestPermissions(t *testing.T) {
	for _, umask := range []int{0, 0o022, 0o277} {
		t.Run(fmt.Sprintf("umask %03o", umask), func(t *testing.T) {
			dir := t.TempDir()
			// A pre-existing subdirectory with a loose mode is tightened.
			if err := os.Mkdir(filepath.Join(dir, "volumes"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(dir, "volumes"), 0o755); err != nil {
				t.Fatal(err)
			}

			old := syscall.Umask(umask)
			s, _, err := Open(dir, bootA, nil)
			if err == nil {
				err = s.Put(vol("/k/a"))
			}
			syscall.Umask(old)
			if err != nil {
				t.Fatal(err)
			}

			for path, want := range map[string]os.FileMode{
				filepath.Join(dir, "volumes"): os.ModeDir | 0o700,
				filepath.Join(dir, "tmp"):     os.ModeDir | 0o700,
				filepath.Join(dir, "corrupt"): os.ModeDir | 0o700,
				recordPath(dir, "/k/a"):       0o600,
			} {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
				}
			}
		})
	}
}

func TestOpenCreatesMissingStateDir(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "a", "b")
	mustOpen(t, dir, bootA)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != os.ModeDir|0o700 {
		t.Errorf("%s: mode %v, want drwx------", dir, fi.Mode())
	}
}

// One crustd per state directory: a second Open is refused, naming the directory and the holder, as
// every user of the record engine is; Close gives the directory up.
func TestSecondOpenRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	_, _, err := OpenWith(dir, bootA, Options{})
	recordfiletest.WantHeld(t, err, dir, "crustd")
	s.Close()
	mustOpen(t, dir, bootA)
}

func TestOpenRefusesEmptyBootID(t *testing.T) {
	if _, _, err := Open(t.TempDir(), "", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Open with an empty boot id: %v, want ErrInvalidArgument", err)
	}
}

func TestConcurrentTargets(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, bootA)
	var wg sync.WaitGroup
	var want []string
	for i := range 8 {
		target := fmt.Sprintf("/k/%d", i)
		want = append(want, target)
		wg.Go(func() {
			for range 5 {
				if err := s.Put(vol(target)); err != nil {
					t.Error(err)
				}
			}
			if i%2 == 0 {
				if err := s.Delete(target); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	_, r := mustOpen(t, dir, bootA)
	want = slices.DeleteFunc(want, func(s string) bool { return (s[len(s)-1]-'0')%2 == 0 })
	if got := targets(r.Volumes); !slices.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
}

func BenchmarkPut(b *testing.B) {
	s, _, err := Open(b.TempDir(), bootA, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	v := fullVol("/var/lib/kubelet/pods/6f1c7c2e-1c1f-4a3e-9d55-0c8a3f1e2b7d/volumes/kubernetes.io~csi/pvc-0d6c/mount")
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Put(v); err != nil {
			b.Fatal(err)
		}
	}
}
