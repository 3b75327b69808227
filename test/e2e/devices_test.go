package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// crustd --device-allow-kind admits block devices by the kind sysfs gives them, whatever they are named,
// on top of --device-allow; an unknown kind stops crustd at start.
func TestDeviceAllowKindFlag(t *testing.T) {
	d := newDaemon(t, "--device-allow", "/dev/*", "--device-allow-kind", "loop")
	c := crustv1.NewVolumeServiceClient(d.conn())
	loop := loopDevice(t, 16<<20)
	disk, _ := nonLoopDevice(t)
	stage := func(dev, pv string) error {
		_, err := c.StageVolume(context.Background(), &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
			VolumeTargetPath: d.podTarget("d0000000-0000-4000-8000-000000000001", pv), VolumeBackingPath: dev, FsType: "ext4"}})
		return err
	}
	if err := stage(loop, "pv-loop"); err != nil {
		t.Fatalf("a loop device with loop allowed: %v", err)
	}
	err := stage(disk, "pv-disk")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec.volume_backing_path") ||
		!strings.Contains(err.Error(), "--device-allow-kind does not allow (it allows loop)") {
		t.Fatalf("%s with only loop allowed: %v", disk, err)
	}

	out, err := exec.Command(filepath.Join(binDir, "crustd"), "--socket", filepath.Join(d.root, "x.sock"),
		"--state-dir", filepath.Join(d.root, "state2"), "--kata-dir", "", "--kubelet-dir", d.kubelet, "--http-addr", "",
		"--device-allow-kind", "loop,floppy").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"floppy" is not a kind of block device`) {
		t.Fatalf("crustd with an unknown kind: %v\n%s", err, out)
	}
}
