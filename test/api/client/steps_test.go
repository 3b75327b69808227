package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/volume"
)

// stepsDriver is the part of a CSI driver that docs/driver-authors.md's "What to change, call by call"
// changes, written as the page says: its controller copies crust's parameters into the volume context,
// its node plugin skips the host's format and mount at stage and deposits at publish. mounted stands in
// for the host mounts an unchanged driver makes (the example runs without root).
type stepsDriver struct {
	crust   *client.Client
	devices string   // where the volumes' devices are (image files here)
	mounted []string // what the driver mounted on the host, "<volume> staged" or "<volume> published"
}

// CreateVolume, step 1: crust's StorageClass parameters go into the volume context.
func (d *stepsDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	volCtx := map[string]string{}
	for k, v := range req.GetParameters() {
		if volume.IsParameterKey(k) {
			volCtx[k] = v
		}
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: req.GetName(), CapacityBytes: 64 << 20, VolumeContext: volCtx}}, nil
}

// NodeStageVolume, step 2: no format and no mount on the host for a deferred mount volume.
func (d *stepsDriver) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if volume.Deferred(req.GetVolumeContext()) && req.GetVolumeCapability().GetMount() != nil {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	d.mounted = append(d.mounted, req.GetVolumeId()+" staged") // the driver's own format and mount
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodePublishVolume, step 3: a deposit instead of the bind mount.
func (d *stepsDriver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if volume.Deferred(req.GetVolumeContext()) && req.GetVolumeCapability().GetMount() != nil {
		if err := os.MkdirAll(req.GetTargetPath(), 0o750); err != nil {
			return nil, err
		}
		return d.crust.Publish(ctx, req, filepath.Join(d.devices, req.GetVolumeId()+".img"), client.CreateFilesystem(), fileType)
	}
	d.mounted = append(d.mounted, req.GetVolumeId()+" published") // the driver's own bind mount
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume, step 4: crustd answers for the paths it holds.
func (d *stepsDriver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if held, err := d.crust.Holds(ctx, req.GetTargetPath()); err != nil || held {
		if err != nil {
			return nil, err
		}
		return d.crust.Unpublish(ctx, req)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil // the driver's own unmount
}

// The four steps of docs/driver-authors.md, as a driver written from the page runs them for a volume of a
// deferring StorageClass and for one of an ordinary class: only the first reaches crustd, and nothing of
// it is mounted on the host.
func Example_driverSteps() {
	ctx := context.Background()
	crust, err := client.New(crustd.SocketFromEnv(), client.WithDriverName("steps.example.com"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = crust.Close() }()
	d := &stepsDriver{crust: crust, devices: imageDir}
	mount := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	const podUID = "0f1e2d3c-0000-4000-8000-00000000005e"
	defer func() { _ = os.RemoveAll(filepath.Join(kubeletDir, "pods", podUID)) }()
	for _, class := range []map[string]string{
		{volume.DeferKey: "true", volume.TotalIOPSKey: "500", "vg": "vg0"}, // a deferring StorageClass
		{"vg": "vg0"}, // an ordinary one
	} {
		cv, _ := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("pv-%d", len(class)), Parameters: class})
		id, volCtx := cv.GetVolume().GetVolumeId(), cv.GetVolume().GetVolumeContext()
		device := filepath.Join(imageDir, id+".img")
		_ = os.WriteFile(device, nil, 0o600)
		_ = os.Truncate(device, 64<<20)
		defer func() { _ = os.Remove(device) }()
		dir := filepath.Join(kubeletDir, "pods", podUID, "volumes", "kubernetes.io~csi", id)
		_ = os.MkdirAll(dir, 0o750)
		target := filepath.Join(dir, "mount")

		_, _ = d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/staging/" + id,
			VolumeCapability: mount, VolumeContext: volCtx})
		if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
			VolumeCapability: mount, VolumeContext: volCtx}); err != nil {
			fmt.Println(id, "publish:", err)
			continue
		}
		held, _ := crust.Holds(ctx, target)
		fmt.Printf("%s: volume context %v, held by crustd %v\n", id, volCtx, held)
		_, _ = d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		held, _ = crust.Holds(ctx, target)
		fmt.Printf("%s: held after unpublish %v\n", id, held)
	}
	fmt.Printf("mounted on the host: %q\n", d.mounted)
	// Output:
	// pv-3: volume context map[crust.dev/defer:true crust.dev/total-iops:500], held by crustd true
	// pv-3: held after unpublish false
	// pv-1: volume context map[], held by crustd false
	// pv-1: held after unpublish false
	// mounted on the host: ["pv-1 staged" "pv-1 published"]
}
