package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil/crustdtest"
	"crust.dev/crust/internal/testutil/harness"
)

// A pod's directory removed while crustd holds a descriptor for it (the pod deleted without an
// unpublish) gets the descriptor collected as the directory goes, not at the next --gc-interval (an
// hour here); another pod's descriptor stays.
func TestOrphanCollectedAsItsPodDirectoryGoes(t *testing.T) {
	root := t.TempDir()
	cfg, err := crustdtest.FileConfig(root)
	if err != nil {
		t.Fatal(err)
	}
	cfg.GCInterval = time.Hour
	crustdtest.StartT(t, cfg, nil)
	c, err := client.New(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx := context.Background()

	publish := func(uid, pv string) string {
		t.Helper()
		return publishFile(ctx, t, c, cfg, root, uid, pv)
	}
	orphan := publish("aaaaaaaa-0000-4000-8000-00000000000a", "pv-orphan")
	live := publish("aaaaaaaa-0000-4000-8000-00000000000b", "pv-live")

	podDir := filepath.Join(cfg.KubeletDir, "pods", "aaaaaaaa-0000-4000-8000-00000000000a")
	if err := os.RemoveAll(podDir); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "the orphan's descriptor collected", func() bool {
		held, err := c.Holds(ctx, orphan)
		return err == nil && !held
	})
	if held, err := c.Holds(ctx, live); err != nil || !held {
		t.Fatalf("the live pod's descriptor: held %v, %v; want it kept", held, err)
	}
}

func TestGCIntervalMustBePositive(t *testing.T) {
	cfg, err := crustdtest.FileConfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg.GCInterval = 0
	err = daemon.Run(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "--gc-interval") {
		t.Fatalf("crustd with --gc-interval 0: %v, want an error naming --gc-interval", err)
	}
}

// publishFile publishes a new 16 MiB image file named pv under root's image directory (cfg being
// crustdtest.FileConfig(root)) for pod uid through c, and returns its target path.
func publishFile(ctx context.Context, t *testing.T, c *client.Client, cfg daemon.Config, root, uid, pv string) string {
	t.Helper()
	target := harness.PodTarget(t, cfg.KubeletDir, uid, pv)
	img := filepath.Join(root, crustdtest.ImageDir, pv+".img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	req := &csi.NodePublishVolumeRequest{VolumeId: pv, TargetPath: target, VolumeCapability: &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}
	if _, err := c.Publish(ctx, req, img, client.VolumeType(crustv1.VolumeType_VOLUME_TYPE_FILE)); err != nil {
		t.Fatal(err)
	}
	return target
}
