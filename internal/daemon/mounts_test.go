package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/handler"
	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/crustdtest"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMountedDevicesAreRefused runs crustd on real loop devices and real mounts: a deposit of a mounted
// device, of another loop device over a mounted one's file, or of a device one of whose partitions is
// mounted, is FAILED_PRECONDITION naming the mount point and stores nothing; a device deposited unmounted and mounted since cannot be claimed until it is
// unmounted again.
func TestMountedDevicesAreRefused(t *testing.T) {
	n := startNode(t)
	c, h, publish, ctx := n.c, n.h, n.publish, context.Background()
	wantRefused := func(what string, err error, point string) {
		t.Helper()
		wantFailedPrecondition(t, what, err, point)
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

	// Another loop device over the file of a mounted one.
	_, file := testutil.Loop(t, 16<<20)
	mounted := testutil.LoopOver(t, file)
	point = mountExt4(t, mounted)
	twin := testutil.LoopOver(t, file)
	target, err = publish("pv-twin", twin)
	wantRefused("deposit of "+twin+" while "+mounted+", over the same file, is mounted", err, point)
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

// node is a real crustd with a driver's client and a runtime handler's connection to it.
type node struct {
	t    *testing.T
	cfg  daemon.Config
	stop func() error
	c    *client.Client
	h    *handler.Client
}

// startNode starts crustd on a new state directory (as root), stopped when the test ends.
func startNode(t *testing.T) *node {
	t.Helper()
	testutil.RequireRoot(t, "to attach and mount loop devices")
	cfg, err := crustdtest.Config(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, cfg: cfg}
	n.start()
	t.Cleanup(func() {
		_ = n.c.Close()
		_ = n.h.Close()
		if err := n.stop(); err != nil {
			t.Errorf("crustd: %v", err)
		}
	})
	return n
}

// start starts crustd and connects to it.
func (n *node) start() {
	n.t.Helper()
	var err error
	if n.stop, err = crustdtest.Start(n.cfg, nil); err != nil {
		n.t.Fatal(err)
	}
	if n.c, err = client.New(n.cfg.Socket); err != nil {
		n.t.Fatal(err)
	}
	if n.h, err = handler.Dial(n.cfg.Socket); err != nil {
		n.t.Fatal(err)
	}
}

// restart stops crustd, as a node's restart of its pod does, and starts it again on the same state.
func (n *node) restart() {
	n.t.Helper()
	_ = n.c.Close()
	_ = n.h.Close()
	if err := n.stop(); err != nil {
		n.t.Fatalf("crustd: %v", err)
	}
	n.start()
}

// publish deposits device for a new pod volume pv, as a driver does in NodePublishVolume, and returns its
// target.
func (n *node) publish(pv, device string) (string, error) {
	target := harness.PodTarget(n.t, n.cfg.KubeletDir, "cccccccc-0000-4000-8000-00000000000c", pv)
	_, err := n.c.Publish(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: pv, TargetPath: target,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}, device)
	return target, err
}

// wantFailedPrecondition fails the test unless err is FAILED_PRECONDITION, as a client reads the code
// (errdefs.FromGRPC), and its message names each of names.
func wantFailedPrecondition(t *testing.T, what string, err error, names ...string) {
	t.Helper()
	if !errors.Is(errdefs.FromGRPC(err), errdefs.ErrFailedPrecondition) {
		t.Fatalf("%s: %v; want FAILED_PRECONDITION", what, err)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Fatalf("%s: %v; want it to name %s", what, err, n)
		}
	}
	t.Logf("%s: %v", what, err)
}

// TestOneDeviceUnderTwoNames runs crustd on real loop devices: two loop devices over one file, and a loop
// device and its partition, are each deposited under two targets and claimed by two sandboxes; the second
// claim is FAILED_PRECONDITION naming the first sandbox and its target, and succeeds once the first
// sandbox releases its claim. A loop device over another file is claimed meanwhile.
func TestOneDeviceUnderTwoNames(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	dev, file := testutil.Loop(t, 16<<20)
	twin := testutil.LoopOver(t, file)
	disk, part := testutil.PartitionedLoop(t, 16<<20)
	other, _ := testutil.Loop(t, 16<<20)

	for i, pair := range [][2]string{{dev, twin}, {part, disk}} {
		first, err := n.publish(fmt.Sprintf("pv-%d-a", i), pair[0])
		if err != nil {
			t.Fatal(err)
		}
		second, err := n.publish(fmt.Sprintf("pv-%d-b", i), pair[1])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.h.Claim(ctx, first, "sandbox-a", ""); err != nil {
			t.Fatal(err)
		}
		_, err = n.h.Claim(ctx, second, "sandbox-b", "")
		wantFailedPrecondition(t, "claim of "+pair[1]+" while "+pair[0]+" is claimed", err, "sandbox-a", first)
		if err := n.h.Release(ctx, first, "sandbox-a"); err != nil {
			t.Fatal(err)
		}
		if _, err := n.h.Claim(ctx, second, "sandbox-b", ""); err != nil {
			t.Fatalf("claim of %s once %s is released: %v", pair[1], pair[0], err)
		}
	}
	target, err := n.publish("pv-other", other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.Claim(ctx, target, "sandbox-a", ""); err != nil {
		t.Fatalf("claim of %s, over another file: %v", other, err)
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

// TestUnstageKeepsTheClaim runs crustd on a real loop device: a volume staged and claimed by sandbox-a is
// unstaged (the answer carries sandbox-a's kept claim), and a deposit of the device under another target
// is FAILED_PRECONDITION naming sandbox-a, before and after a restart of crustd; once sandbox-a releases
// its claim, the deposit and sandbox-b's claim succeed.
func TestUnstageKeepsTheClaim(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	dev, _ := testutil.Loop(t, 16<<20)
	first, err := n.publish("pv-first", dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.Claim(ctx, first, "sandbox-a", ""); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+n.cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	r, err := crustv1.NewVolumeServiceClient(conn).UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: first})
	if err != nil || r.GetKeptClaim().GetSandboxId() != "sandbox-a" {
		t.Fatalf("unstage of a claimed volume: %v, %v; want the answer to carry sandbox-a's kept claim", r, err)
	}
	_, err = n.publish("pv-second", dev)
	wantFailedPrecondition(t, "deposit of "+dev+" while an unstaged volume's claim holds it", err, "sandbox-a")
	n.restart()
	_, err = n.publish("pv-second", dev)
	wantFailedPrecondition(t, "the same deposit after a restart of crustd", err, "sandbox-a")
	if err := n.h.Release(ctx, first, "sandbox-a"); err != nil {
		t.Fatal(err)
	}
	second, err := n.publish("pv-second", dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.Claim(ctx, second, "sandbox-b", ""); err != nil {
		t.Fatalf("claim once the kept claim is released: %v", err)
	}
}
