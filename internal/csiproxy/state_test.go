package csiproxy

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/internal/recordfile/recordfiletest"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, err := openState(dir, "boot-1", testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{Kind: KindPublish, Path: "/k/pods/u/volumes/x/mount", VolumeID: "v1", Mode: ModeDeferred,
		PrivatePath: s.PrivateDir("/k/pods/u/volumes/x/mount") + "/dev", Device: "/dev/loop3", FsType: "xfs"}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	r.Phase = PhasePublished
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(&Record{Kind: KindStage, Path: "/k/staging/x", VolumeID: "v1", Mode: ModeBlockStage, Phase: PhaseStaged}); err != nil {
		t.Fatal(err)
	}
	// A leftover temporary file is removed at the next open.
	if err := os.WriteFile(filepath.Join(dir, "tmp", "leftover"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	s.Close() // the process ends
	s2, err := openState(dir, "boot-1", testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	got := s2.Get(KindPublish, r.Path)
	if got == nil || got.Phase != PhasePublished || got.Device != "/dev/loop3" || got.Stale || !got.Updated.Equal(r.Updated) {
		t.Fatalf("reloaded %+v, want %+v", got, r)
	}
	if len(s2.List()) != 2 {
		t.Fatalf("list = %v", s2.List())
	}
	if names, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(names) != 0 {
		t.Fatalf("tmp not emptied: %v", names)
	}
	// The file is one line in the documented shape.
	b, err := os.ReadFile(filepath.Join(dir, "records", recordKey(KindPublish, r.Path)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte(`{"version":1,"bootId":"boot-1","sha256":"`)) || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("record file:\n%s", b)
	}

	// Another boot: the records are kept, marked stale.
	s2.Close()
	s3, err := openState(dir, "boot-2", testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := s3.Get(KindPublish, r.Path); got == nil || !got.Stale {
		t.Fatalf("after a reboot: %+v, want a stale record", got)
	}
	if err := s3.Delete(KindPublish, r.Path); err != nil {
		t.Fatal(err)
	}
	if err := s3.Delete(KindPublish, r.Path); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if s3.Get(KindPublish, r.Path) != nil {
		t.Fatal("deleted record still there")
	}
}

func TestStateDamagedAndNewer(t *testing.T) {
	dir := t.TempDir()
	s, err := openState(dir, "b", testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{Kind: KindPublish, Path: "/t", VolumeID: "v", Mode: ModeHost, Phase: PhasePublished}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "records", recordKey(KindPublish, "/t")+".json")
	b, _ := os.ReadFile(file)

	// A flipped payload byte: moved aside.
	bad := bytes.Replace(b, []byte(`"volumeId":"v"`), []byte(`"volumeId":"w"`), 1)
	if err := os.WriteFile(file, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	// A file under the wrong name: moved aside.
	if err := os.WriteFile(filepath.Join(dir, "records", "other.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := openState(dir, "b", testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.List()) != 0 {
		t.Fatalf("damaged records loaded: %v", s2.List())
	}
	if moved, _ := os.ReadDir(filepath.Join(dir, "corrupt")); len(moved) != 2 {
		t.Fatalf("corrupt/ holds %v, want 2 files", moved)
	}

	// A newer version: refuse to start, and move nothing.
	newer := bytes.Replace(b, []byte(`"version":1`), []byte(`"version":2`), 1)
	if err := os.WriteFile(file, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if _, err := openState(dir, "b", testLog(t)); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open over a newer record: %v", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the newer record was touched: %v", err)
	}
}

// FuzzDecodeRecord: a record file with any content is decoded or refused without a panic, and an
// accepted one names a path and a known kind.
func FuzzDecodeRecord(f *testing.F) {
	payload := []byte(`{"kind":"publish","path":"/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount","phase":"published"}`)
	good, _ := recordfile.Encode(recordVersion, "boot", payloadField, payload)
	f.Add(good, "boot")
	f.Add(good, "other-boot")
	f.Add([]byte(`{"version":9}`), "boot")
	f.Fuzz(func(t *testing.T, data []byte, boot string) {
		r, err := decodeRecord(data, boot)
		if err != nil {
			return
		}
		if r.Path == "" || (r.Kind != KindPublish && r.Kind != KindStage) {
			t.Fatalf("accepted %q as %+v", data, r)
		}
	})
}

// A symbolic link planted at the place of one of the state directory's subdirectories makes openState
// fail naming it, and nothing is removed, read or moved through it.
func TestStatePlantedLinks(t *testing.T) {
	for _, sub := range []string{"tmp", "records", "corrupt", "block"} {
		t.Run(sub, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, sub)); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(outside)
			if err != nil {
				t.Fatal(err)
			}
			mode := fi.Mode()
			s, err := openState(dir, "b", testLog(t))
			if err == nil {
				s.Close()
				t.Fatalf("openState accepted a link at %s", sub)
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, sub)) {
				t.Errorf("the error does not name %s: %v", sub, err)
			}
			entries, _ := os.ReadDir(outside)
			fi, _ = os.Stat(outside)
			if len(entries) != 1 || fi.Mode() != mode {
				t.Errorf("the link's target changed: %v, %v", entries, fi.Mode())
			}
		})
	}
}

// One proxy per state directory: a second one is refused at start, naming the directory and the first,
// with the refusal every user of the record engine gives (crustd's: internal/store); once the first
// closes, the directory is free.
func TestSecondProxyOnOneStateDir(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DriverAddress: filepath.Join(dir, "driver.sock"), CrustSocket: filepath.Join(dir, "crust.sock"),
		StateDir: filepath.Join(dir, "state")}
	ctx := context.Background()
	first, err := New(ctx, cfg, testLog(t), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(ctx, cfg, testLog(t), Deps{})
	recordfiletest.WantHeld(t, err, cfg.StateDir, "crust-csi-proxy")
	first.Close()
	again, err := New(ctx, cfg, testLog(t), Deps{})
	if err != nil {
		t.Fatalf("a proxy after the first closed: %v", err)
	}
	again.Close()
}
