package csiproxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
// removed and the target stays; a file, a link or a device anywhere in it is FAILED_PRECONDITION naming
// the entry and what it is, and nothing is removed; a missing target is no error.
func TestClearTarget(t *testing.T) {
	target := filepath.Join(t.TempDir(), "mount")
	if err := checkTarget(target); err != nil {
		t.Fatalf("a missing target: %v", err)
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
			for _, fn := range []func(string) error{checkTarget, clearTarget} {
				err := fn(target)
				if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), bad+", "+tc.why) {
					t.Fatalf("a target holding %s: %v, want FAILED_PRECONDITION naming %s, %s", tc.why, err, bad, tc.why)
				}
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

// TestUnpublishDeferredWithSubPath: kubelet's subPath directories left in a deferred volume's target do
// not keep it from being unpublished (they go with the target); a file in the target is data written on
// the node's disk, and unpublish refuses with FAILED_PRECONDITION naming it, changing nothing (the
// descriptor, the record and the file stay), until it is moved away.
func TestUnpublishDeferredWithSubPath(t *testing.T) {
	e, node, vol, staging, target := published(t, "subpath", "0e0e0e0e-0000-4000-8000-0000000000d1", true)
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

	// Data on the node's disk in the target: refused, nothing changed.
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap(), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	mkdirs(t, target, "provisioning-5241")
	written := filepath.Join(target, "provisioning-5241", "data")
	if err := os.WriteFile(written, []byte("written on the node"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := node.NodeUnpublishVolume(ctx, unpublish)
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), written+", a regular file") {
		t.Fatalf("unpublish of a deferred target holding a file: %v, want FAILED_PRECONDITION naming %s", err, written)
	}
	if _, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target}); err != nil {
		t.Errorf("the descriptor after a refused unpublish: %v; it must stay", err)
	}
	if b, err := os.ReadFile(written); err != nil || string(b) != "written on the node" {
		t.Errorf("the file after a refused unpublish: %q, %v; it must stay", b, err)
	}
	if recs := e.stateRecords(); len(recs) == 0 {
		t.Error("the proxy forgot the publish it refused to undo")
	}
	if err := os.Remove(written); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, unpublish); err != nil {
		t.Fatalf("unpublish once the file is moved away: %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
