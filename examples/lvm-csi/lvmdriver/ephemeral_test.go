package lvmdriver_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"crust.dev/crust/examples/lvm-csi/lvmdriver"
)

// An inline ephemeral volume is made at its first publish with the size its attributes ask, mounted
// without a staging path (mount) or bound as a device (block), answers stats under kubelet's id, and is
// gone from the volume group after unpublish. A bad size is refused and makes nothing.
func TestInlineEphemeral(t *testing.T) {
	d, vg := startOnVG(t, 2<<30, lvmdriver.Config{})
	ctx := ctxT(t)
	for i, tc := range []struct {
		name string
		cap  *csi.VolumeCapability
	}{
		{"mount", mountCap("ext4", "2000")},
		{"block", blockCap()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// kubelet names inline volumes csi-<sha256 hex>, not in this driver's form of ids.
			id := fmt.Sprintf("csi-%064x", i+1)
			target := filepath.Join(t.TempDir(), "pod", "mount")
			_ = os.MkdirAll(filepath.Dir(target), 0o750)
			pub := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: tc.cap,
				VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "size": "96Mi",
					"csi.storage.k8s.io/pod.name": "p"}}
			for i := 0; i < 2; i++ {
				if _, err := d.NodePublishVolume(ctx, pub); err != nil {
					t.Fatalf("publish %d: %v", i, err)
				}
			}
			if lvs, err := vg.LVs(); err != nil || len(lvs) != 1 || lvs[0] != lvmdriver.VolumeID(id) {
				t.Fatalf("logical volumes after publish: %v, %v", lvs, err)
			}
			if !mounted(t, target) {
				t.Fatal("nothing mounted at the target")
			}
			r, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			if err != nil {
				t.Fatalf("stats: %v", err)
			}
			total := r.GetUsage()[0].GetTotal()
			if total < 80<<20 || total > 96<<20 {
				t.Errorf("size %d bytes, want about 96 MiB", total)
			}
			if tc.cap.GetMount() != nil {
				var st unix.Stat_t
				if err := unix.Stat(target, &st); err != nil || st.Gid != 2000 {
					t.Errorf("fsGroup not applied: gid %d (%v)", st.Gid, err)
				}
			}
			if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			if lvs, err := vg.LVs(); err != nil || len(lvs) != 0 {
				t.Fatalf("logical volumes after unpublish: %v, %v", lvs, err)
			}
			if _, err := os.Lstat(target); !os.IsNotExist(err) {
				t.Errorf("target left behind: %v", err)
			}
		})
	}
	_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "csi-bad", TargetPath: filepath.Join(t.TempDir(), "m"),
		VolumeCapability: mountCap("ext4", ""), VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "size": "-1"}})
	wantCode(t, "negative size", err, codes.InvalidArgument)
	if lvs, err := vg.LVs(); err != nil || len(lvs) != 0 {
		t.Fatalf("a refused publish made volumes: %v, %v", lvs, err)
	}
}

// With the switches that make it behave as most drivers do, CreateVolume returns no volume context
// and a volume created for filesystem use is not staged or published as a raw block device; one
// created as block is.
func TestRealDriverSwitches(t *testing.T) {
	d, _ := startOnVG(t, 1<<30, lvmdriver.Config{NoVolumeContext: true, StrictAccessType: true})
	ctx := ctxT(t)
	create := func(name string, c *csi.VolumeCapability) string {
		t.Helper()
		cv, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: map[string]string{"crust.dev/defer": "true"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(cv.GetVolume().GetVolumeContext()) != 0 {
			t.Errorf("volume context %v, want none", cv.GetVolume().GetVolumeContext())
		}
		return cv.GetVolume().GetVolumeId()
	}
	fsID, blockID := create("pvc-fs", mountCap("ext4", "")), create("pvc-block", blockCap())
	_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: fsID, TargetPath: filepath.Join(t.TempDir(), "t"),
		VolumeCapability: mountCap("ext4", "")})
	wantCode(t, "publish of a mount volume without a staging path", err, codes.FailedPrecondition)
	dir := t.TempDir()
	_, err = d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: fsID, StagingTargetPath: filepath.Join(dir, "s1"), VolumeCapability: blockCap()})
	wantCode(t, "block stage of a filesystem volume", err, codes.InvalidArgument)
	_, err = d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: fsID, TargetPath: filepath.Join(dir, "p1"), VolumeCapability: blockCap()})
	wantCode(t, "block publish of a filesystem volume", err, codes.InvalidArgument)
	if mounted(t, filepath.Join(dir, "p1")) {
		t.Error("a refused publish mounted something")
	}
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: blockID, StagingTargetPath: filepath.Join(dir, "s2"), VolumeCapability: blockCap()}); err != nil {
		t.Fatalf("block stage of a block volume: %v", err)
	}
	target := filepath.Join(dir, "p2")
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: blockID, StagingTargetPath: filepath.Join(dir, "s2"),
		TargetPath: target, VolumeCapability: blockCap()}); err != nil {
		t.Fatalf("block publish of a block volume: %v", err)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: blockID, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
}
