package csiproxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/api/errdefs"
)

// For the driver's own volumes, the proxy honours what it advertises and the driver lacks: the group of
// volume_mount_group never reaches the driver and is given to the published filesystem as kubelet would
// (not to a read-only one); node expansion is kubelet's no-op; stats the driver has stay the driver's.
func TestServedCapabilities(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	d := &stubDriver{}
	cc := startProxy(t, Config{CSIAddress: filepath.Join(dir, "csi.sock"), DriverAddress: serveStub(t, dir, d),
		CrustSocket: filepath.Join(dir, "no-crustd.sock"), StateDir: filepath.Join(dir, "state")}, quietLog())
	node := csi.NewNodeClient(cc)
	ctx := context.Background()
	last := func() any {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.seen[len(d.seen)-1]
	}
	withGroup := func(g string) *csi.VolumeCapability {
		c := mountCap()
		c.GetMount().VolumeMountGroup = g
		return c
	}
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v1", StagingTargetPath: filepath.Join(dir, "st"),
		VolumeCapability: withGroup("2000")}); err != nil {
		t.Fatal(err)
	}
	if g := last().(*csi.NodeStageVolumeRequest).GetVolumeCapability().GetMount().GetVolumeMountGroup(); g != "" {
		t.Errorf("the driver was given volume_mount_group %q at stage", g)
	}
	for _, tc := range []struct {
		name     string
		readOnly bool
		wantGid  uint32
	}{{"rw", false, 2000}, {"ro", true, 0}} {
		target := filepath.Join(dir, tc.name)
		if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(target, "sub", "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v1", TargetPath: target, Readonly: tc.readOnly,
			StagingTargetPath: filepath.Join(dir, "st"), VolumeCapability: withGroup("2000")}); err != nil {
			t.Fatal(err)
		}
		if g := last().(*csi.NodePublishVolumeRequest).GetVolumeCapability().GetMount().GetVolumeMountGroup(); g != "" {
			t.Errorf("%s: the driver was given volume_mount_group %q", tc.name, g)
		}
		for _, p := range []string{target, filepath.Join(target, "sub"), filepath.Join(target, "sub", "f")} {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil || st.Gid != tc.wantGid {
				t.Errorf("%s: %s has group %d, want %d (%v)", tc.name, p, st.Gid, tc.wantGid, err)
			}
		}
	}
	_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v1", TargetPath: filepath.Join(dir, "rw"),
		VolumeCapability: withGroup("staff")})
	var fe *errdefs.FieldError
	if !errors.As(errdefs.FromGRPC(err), &fe) || fe.Field != "volume_capability.mount.volume_mount_group" {
		t.Errorf("volume_mount_group \"staff\": %v, want InvalidArgument naming volume_capability.mount.volume_mount_group", err)
	}

	n := len(d.seen)
	if r, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "v1", VolumePath: filepath.Join(dir, "rw")}); err != nil || r.GetCapacityBytes() != 0 {
		t.Errorf("node expansion for a driver without it: %v, %v; want a no-op", r, err)
	}
	if _, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "v1", VolumePath: filepath.Join(dir, "nope")}); status.Code(err) != codes.NotFound {
		t.Errorf("node expansion of a path that is not there: %v, want NotFound", err)
	}
	t.Chdir(dir) // "rw" exists relative to it, but a relative path names no volume
	if _, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "v1", VolumePath: "rw"}); status.Code(err) != codes.NotFound {
		t.Errorf("node expansion of a relative path: %v, want NotFound", err)
	}
	if r, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v1", VolumePath: filepath.Join(dir, "rw")}); err != nil || r.GetUsage()[0].GetTotal() != 42 {
		t.Errorf("stats of a driver that has them: %v, %v; want the driver's", r, err)
	}
	if len(d.seen) != n+1 {
		t.Errorf("the driver saw %d calls for one stats call and two expansions, want 1", len(d.seen)-n)
	}
}

// ownStats answers for a driver without GET_VOLUME_STATS: statfs of a directory, the size of a device.
func TestOwnStats(t *testing.T) {
	r, err := ownStats(t.TempDir())
	if err != nil || len(r.GetUsage()) != 2 || r.GetUsage()[0].GetTotal() == 0 || r.GetUsage()[1].GetUnit() != csi.VolumeUsage_INODES {
		t.Fatalf("stats of a directory: %v, %v", r, err)
	}
	if _, err := ownStats(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stats of nothing: %v, want NotFound", err)
	}
	// A relative path names no volume, even where the working directory has something at it.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "some", "path"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	if _, err := ownStats("some/path"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stats of a relative path: %v, want NotFound", err)
	}
}
