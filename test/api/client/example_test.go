package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
)

// A CSI node plugin defers a mount volume whose StorageClass says crust.dev/defer: "true": NodePublishVolume
// deposits a descriptor instead of mounting, and the calls that follow go to crustd for the paths it holds.
// (Here an image file stands in for the block device a driver passes, such as /dev/vg0/pv-1.)
func Example_publish() {
	ctx := context.Background()
	crust, err := client.New(crustd.SocketFromEnv(), client.WithDriverName("lvm.example.com"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = crust.Close() }()

	const podUID = "0f1e2d3c-0000-4000-8000-000000000001"
	dir := filepath.Join(kubeletDir, "pods", podUID, "volumes", "kubernetes.io~csi", "pv-1")
	_ = os.MkdirAll(dir, 0o750) // kubelet makes the parent of the target path
	defer func() { _ = os.RemoveAll(filepath.Join(kubeletDir, "pods", podUID)) }()
	device := filepath.Join(imageDir, "pv-1.img")
	_ = os.WriteFile(device, nil, 0o600)
	_ = os.Truncate(device, 64<<20)
	defer func() { _ = os.Remove(device) }()

	// What kubelet sends in NodePublishVolume.
	req := &csi.NodePublishVolumeRequest{
		VolumeId:   "pv-1",
		TargetPath: filepath.Join(dir, "mount"),
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
				FsType: "xfs", MountFlags: []string{"noatime"}, VolumeMountGroup: "2000",
			}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: map[string]string{
			volume.DeferKey: "true", volume.PodUIDKey: podUID, volume.PodNameKey: "web-0", volume.PodNamespaceKey: "shop",
		},
	}

	// NodePublishVolume.
	if volume.Deferred(req.GetVolumeContext()) && req.GetVolumeCapability().GetMount() != nil {
		_ = os.MkdirAll(req.GetTargetPath(), 0o750)
		if _, err := crust.Publish(ctx, req, device, client.CreateFilesystem(),
			client.VolumeType(crustv1.VolumeType_VOLUME_TYPE_FILE)); err != nil {
			fmt.Println(status.Code(err), err) // return err as it is: its code is CSI's
			return
		}
	}
	v, _ := crust.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: req.GetTargetPath()})
	s := v.GetVolume().GetSpec()
	fmt.Println("deposited:", s.GetFsType(), s.GetMountFlags(), "fsGroup", s.GetVolumeSupplementalGroup(),
		"pod", s.GetMetadata()[volume.PodNamespaceKey]+"/"+s.GetMetadata()[volume.PodNameKey])

	// NodeGetVolumeStats: the path is deferred, so crustd answers, from the sandbox that uses the volume.
	// No sandbox does yet: the total is the device's size, and usage is not known.
	if held, _ := crust.Holds(ctx, req.GetTargetPath()); held {
		st, err := crust.Stats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "pv-1", VolumePath: req.GetTargetPath()})
		for _, u := range st.GetUsage() {
			fmt.Println("stats:", status.Code(err), u.GetUnit(), "total", u.GetTotal()>>20, "MiB")
		}
	}

	// NodeUnpublishVolume.
	if held, _ := crust.Holds(ctx, req.GetTargetPath()); held {
		if _, err := crust.Unpublish(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "pv-1", TargetPath: req.GetTargetPath()}); err == nil {
			_ = os.Remove(req.GetTargetPath())
		}
	}
	held, _ := crust.Holds(ctx, req.GetTargetPath())
	fmt.Println("held after unpublish:", held)
	// Output:
	// deposited: xfs [noatime] fsGroup 2000 pod shop/web-0
	// stats: OK BYTES total 64 MiB
	// held after unpublish: false
}
