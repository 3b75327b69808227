package daemon_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/handler"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/crustdtest"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMountedDevicesAreRefused runs crustd on real loop devices and real mounts: a deposit of a mounted
// device, or of a device one of whose partitions is mounted, is FAILED_PRECONDITION naming the mount
// point and stores nothing; a device deposited unmounted and mounted since cannot be claimed until it is
// unmounted again.
func TestMountedDevicesAreRefused(t *testing.T) {
	testutil.RequireRoot(t, "to attach and mount loop devices")
	root := t.TempDir()
	cfg, err := crustdtest.Config(root)
	if err != nil {
		t.Fatal(err)
	}
	crustdtest.StartT(t, cfg, nil)
	c, err := client.New(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	h, err := handler.Dial(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	ctx := context.Background()

	publish := func(pv, device string) (target string, err error) {
		target = harness.PodTarget(t, cfg.KubeletDir, "cccccccc-0000-4000-8000-00000000000c", pv)
		_, err = c.Publish(ctx, &csi.NodePublishVolumeRequest{VolumeId: pv, TargetPath: target,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			}}, device)
		return target, err
	}
	// The answer's gRPC code is read as a client reads it (errdefs.FromGRPC: FAILED_PRECONDITION and
	// nothing else is ErrFailedPrecondition).
	wantRefused := func(what string, err error, point string) {
		t.Helper()
		if !errors.Is(errdefs.FromGRPC(err), errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), point) {
			t.Fatalf("%s: %v; want FAILED_PRECONDITION naming %s", what, err, point)
		}
		t.Logf("%s: %v", what, err)
	}
	wantHeld := func(target string, want bool) {
		t.Helper()
		if held, err := c.Holds(ctx, target); err != nil || held != want {
			t.Fatalf("crustd holds %s: %v, %v; want %v", target, held, err, want)
		}
	}

	// A mounted loop device.
	dev, _ := testutil.Loop(t, 16<<20)
	point := mountExt4(t, dev)
	target, err := publish("pv-mounted", dev)
	wantRefused("deposit of a mounted "+dev, err, point)
	wantHeld(target, false)

	// A loop device whose partition is mounted.
	disk, part := testutil.PartitionedLoop(t, 16<<20)
	point = mountExt4(t, part)
	target, err = publish("pv-partition", disk)
	wantRefused("deposit of "+disk+" with "+part+" mounted", err, point)
	wantHeld(target, false)

	// Deposited unmounted, then mounted: no claim until it is unmounted.
	dev, _ = testutil.Loop(t, 16<<20)
	mkfsExt4(t, dev)
	target, err = publish("pv-later", dev)
	if err != nil {
		t.Fatalf("deposit of an unmounted %s: %v", dev, err)
	}
	point = t.TempDir()
	if err := unix.Mount(dev, point, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(point, 0) }) // when the test fails before it unmounts
	_, err = h.Claim(ctx, target, "sandbox-1", "")
	wantRefused("claim of "+dev+" mounted since its deposit", err, point)
	if err := unix.Unmount(point, 0); err != nil {
		t.Fatal(err)
	}
	if v, err := h.Claim(ctx, target, "sandbox-1", ""); err != nil || v.GetClaim().GetSandboxId() != "sandbox-1" {
		t.Fatalf("claim once unmounted: %v, %v", v.GetClaim(), err)
	}
}

// mkfsExt4 makes an ext4 filesystem on dev.
func mkfsExt4(t *testing.T, dev string) {
	t.Helper()
	if out, err := exec.Command("mkfs.ext4", "-q", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v: %s", dev, err, out)
	}
}

// mountExt4 makes an ext4 filesystem on dev and mounts it on a new directory, unmounted when the test
// ends (before the device is detached), and returns the directory.
func mountExt4(t *testing.T, dev string) string {
	t.Helper()
	mkfsExt4(t, dev)
	point := t.TempDir()
	if err := unix.Mount(dev, point, "ext4", 0, ""); err != nil {
		t.Fatalf("mount %s: %v", dev, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(point, 0) })
	return point
}
