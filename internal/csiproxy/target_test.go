package csiproxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// mkdirs makes each of dirs (relative paths) under root.
func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClearTarget: the empty directories kubelet leaves in a deferred target (a subPath's, nested) are
// removed and the target stays; a file, a link or a device anywhere in it is named by targetData with
// what it is, and clearTarget answers FAILED_PRECONDITION naming it, removing nothing; a missing target
// is no error.
func TestClearTarget(t *testing.T) {
	target := filepath.Join(t.TempDir(), "mount")
	if entry, _, err := targetData(target); err != nil || entry != "" {
		t.Fatalf("a missing target: %q, %v", entry, err)
	}
	mkdirs(t, target, "provisioning-5241", "a/b/c", "a/d")
	if err := clearTarget(target); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(target); err != nil || len(entries) != 0 {
		t.Fatalf("after clearTarget the target holds %v (%v), want it empty and there", entries, err)
	}

	outside := t.TempDir()
	for _, tc := range []struct {
		name, entry, why string
		make             func(p string) error
	}{
		{"file", "sub/deeper/f", "a regular file", func(p string) error { return os.WriteFile(p, []byte("on the node's disk"), 0o600) }},
		{"link", "sub/l", "a symbolic link", func(p string) error { return os.Symlink(outside, p) }},
		{"fifo", "f", "a FIFO", func(p string) error { return unix.Mkfifo(p, 0o600) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mkdirs(t, target, "sub/deeper", "sub/other/empty", "z")
			bad := filepath.Join(target, tc.entry)
			if err := tc.make(bad); err != nil {
				t.Fatal(err)
			}
			if entry, what, err := targetData(target); err != nil || entry != bad || what != tc.why {
				t.Fatalf("targetData of a target holding %s: %q, %q, %v", tc.why, entry, what, err)
			}
			err := clearTarget(target)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), bad+", "+tc.why) {
				t.Fatalf("a target holding %s: %v, want FAILED_PRECONDITION naming %s, %s", tc.why, err, bad, tc.why)
			}
			for _, d := range []string{"sub/deeper", "sub/other/empty", "z", tc.entry} {
				if _, err := os.Lstat(filepath.Join(target, d)); err != nil {
					t.Errorf("after a refused clearTarget: %v; nothing may be removed", err)
				}
			}
			if err := os.Remove(bad); err != nil {
				t.Fatal(err)
			}
			if err := clearTarget(target); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestUnpublishQuarantinesTargetData: kubelet's subPath directories left in a deferred volume's target
// do not keep it from being unpublished (they go with the target). A file in the target is data written
// on the node's disk: unpublish moves the whole target, by a rename, into
// <kubelet>/crust-quarantine/<pod uid>/<volume id>-<time> (each directory 0700), counts it, and goes on.
// A mount point in the target, or a quarantine that is a link, keeps the refusal: FAILED_PRECONDITION
// naming the entry and why, and nothing changes (the descriptor, the record and the file stay).
func TestUnpublishQuarantinesTargetData(t *testing.T) {
	e := newEnv(t)
	p, cc := runProxy(t, e.config(), e.log, Deps{})
	node := csi.NewNodeClient(cc)
	const uid = "0e0e0e0e-0000-4000-8000-0000000000d1"
	vol := e.createVolume("pvc-subpath", 64<<20, true)
	staging, target := e.staging("pv-subpath"), e.target(uid, "pv-subpath")
	stageAndPublish(t, node, vol, staging, target)
	ctx := context.Background()
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}

	// As kubelet makes a subPath, and leaves it: an empty directory in the target.
	mkdirs(t, target, "provisioning-5241", "nested/sub")
	if _, err := node.NodeUnpublishVolume(ctx, unpublish); err != nil {
		t.Fatalf("unpublish of a deferred target holding kubelet's subPath directories: %v", err)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("the target after unpublish: %v, want it gone", err)
	}

	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap(), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	mkdirs(t, target, "provisioning-5241/m")
	refused := func(entry, what, why string) {
		t.Helper()
		_, err := node.NodeUnpublishVolume(ctx, unpublish)
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), entry+", "+what) ||
			!strings.Contains(st.Message(), why) {
			t.Fatalf("unpublish: %v, want FAILED_PRECONDITION naming %s, %s and %q", err, entry, what, why)
		}
		if _, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target}); err != nil {
			t.Errorf("the descriptor after a refused unpublish: %v; it must stay", err)
		}
		if _, err := os.Lstat(entry); err != nil {
			t.Errorf("%s after a refused unpublish: %v; it must stay", entry, err)
		}
		if recs := e.stateRecords(); len(recs) == 0 {
			t.Error("the proxy forgot the publish it refused to undo")
		}
	}
	// A mount point in the target is not moved: it would stay mounted in the quarantine.
	inner := filepath.Join(target, "provisioning-5241", "m")
	if err := unix.Mount("tmpfs", inner, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	refused(inner, "a mount point", "unmount it")
	if err := unix.Unmount(inner, 0); err != nil {
		t.Fatal(err)
	}

	written := filepath.Join(target, "provisioning-5241", "data")
	if err := os.WriteFile(written, []byte("written on the node"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The quarantine a link: refused, the link not followed.
	quarantine, elsewhere := filepath.Join(e.kubelet, QuarantineDir), t.TempDir()
	if err := os.Symlink(elsewhere, quarantine); err != nil {
		t.Fatal(err)
	}
	refused(written, "a regular file", "a symbolic link")
	if names, _ := os.ReadDir(elsewhere); len(names) != 0 {
		t.Errorf("the quarantine's link was followed: %s holds %v", elsewhere, names)
	}
	// (A quarantine on another filesystem than the target: TestQuarantineAcrossFilesystems.)
	if err := os.Remove(quarantine); err != nil {
		t.Fatal(err)
	}

	// Moved into the quarantine: unpublished, nothing lost.
	if _, err := node.NodeUnpublishVolume(ctx, unpublish); err != nil {
		t.Fatalf("unpublish of a target holding a file: %v, want it moved into the quarantine", err)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("the target after unpublish: %v, want it gone", err)
	}
	moved, _ := filepath.Glob(filepath.Join(quarantine, uid, vol.GetVolumeId()+"-*"))
	if len(moved) != 1 {
		t.Fatalf("quarantined targets %v, want one", moved)
	}
	if b, err := os.ReadFile(filepath.Join(moved[0], "provisioning-5241", "data")); err != nil || string(b) != "written on the node" {
		t.Errorf("the quarantined file: %q, %v", b, err)
	}
	for _, d := range []string{quarantine, filepath.Dir(moved[0])} {
		if fi, err := os.Lstat(d); err != nil || fi.Mode() != os.ModeDir|0o700 {
			t.Errorf("%s: %v, %v; want a directory of mode 0700", d, fi.Mode(), err)
		}
	}
	if n := metricValue(t, p, "crust_csi_proxy_quarantined_targets_total"); n != 1 {
		t.Errorf("crust_csi_proxy_quarantined_targets_total %v, want 1", n)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

// metricValue is the value of the metric name, a counter or a gauge without labels, that p exports.
func metricValue(t *testing.T, p *Proxy, name string) float64 {
	t.Helper()
	families, err := p.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			m := f.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("%s is not exported", name)
	return 0
}

// quarantineName keeps a volume id's letters, digits, '.', '_' and '-', replaces the rest (a '/' above
// all) and cuts it, so that any volume id makes one entry name, and adds the time in UTC.
func TestQuarantineName(t *testing.T) {
	at := time.Date(2026, 12, 6, 15, 14, 12, 123456789, time.FixedZone("x", 3600))
	for id, want := range map[string]string{
		"pvc-1.a_b":              "pvc-1.a_b-20261206T141412.123456789Z",
		"projects/p/disks/d":     "projects_p_disks_d-20261206T141412.123456789Z",
		"..":                     "..-20261206T141412.123456789Z",
		strings.Repeat("é", 150): strings.Repeat("_", 200) + "-20261206T141412.123456789Z",
	} {
		if got := quarantineName(id, at); got != want {
			t.Errorf("quarantineName(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestQuarantineAcrossFilesystems: a target whose pod directory is a filesystem of its own (a tmpfs
// here) cannot be renamed into the quarantine (EXDEV); it is copied, verified and removed instead, its
// files, directories and links (as links, never followed) all there. A target holding what cannot be
// copied (a FIFO) is refused naming it, and left as it was, with nothing of it in the quarantine.
func TestQuarantineAcrossFilesystems(t *testing.T) {
	requireRoot(t)
	kubelet := t.TempDir()
	for _, uid := range []string{"pod-a", "pod-b"} {
		target := filepath.Join(kubelet, "pods", uid, "volumes", "kubernetes.io~csi", "pv", "mount")
		podDir := filepath.Join(kubelet, "pods", uid)
		if err := os.MkdirAll(podDir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", podDir, "tmpfs", 0, "size=4m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(podDir, unix.MNT_DETACH) })
		if err := os.MkdirAll(filepath.Join(target, "sub", "empty"), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string]string{"written": "on the node's disk", "sub/deeper": "more"} {
			if err := os.WriteFile(filepath.Join(target, name), []byte(data), 0o640); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("/etc/passwd", filepath.Join(target, "link")); err != nil {
			t.Fatal(err)
		}
		if uid == "pod-b" {
			if err := unix.Mkfifo(filepath.Join(target, "sub", "fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := quarantineTarget(target, "vol-1", time.Now())
			if err == nil || !strings.Contains(err.Error(), "fifo") {
				t.Fatalf("quarantine of a target holding a FIFO: %v; want a refusal naming it", err)
			}
			if b, err := os.ReadFile(filepath.Join(target, "sub", "deeper")); err != nil || string(b) != "more" {
				t.Fatalf("the refused target lost its data: %q, %v", b, err)
			}
			if left, _ := os.ReadDir(filepath.Join(kubelet, QuarantineDir, uid)); len(left) != 0 {
				t.Fatalf("a refused copy left %v in the quarantine", left)
			}
			continue
		}
		dest, err := quarantineTarget(target, "vol-1", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(target); !os.IsNotExist(err) {
			t.Fatalf("the target is still there: %v", err)
		}
		for name, want := range map[string]string{"written": "on the node's disk", "sub/deeper": "more"} {
			if b, err := os.ReadFile(filepath.Join(dest, name)); err != nil || string(b) != want {
				t.Errorf("quarantined %s: %q, %v", name, b, err)
			}
		}
		if to, err := os.Readlink(filepath.Join(dest, "link")); err != nil || to != "/etc/passwd" {
			t.Errorf("quarantined link: %q, %v", to, err)
		}
		if fi, err := os.Stat(filepath.Join(dest, "sub", "empty")); err != nil || !fi.IsDir() {
			t.Errorf("quarantined empty directory: %v", err)
		}
	}
}
