package client_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/volume"
)

// stepsDriver is the part of a CSI driver that docs/driver-authors.md's "What to change, call by call"
// changes, written as the page says: its controller copies crust's parameters into the volume context,
// its node plugin skips the host's format and mount at stage and, at publish, deposits for a pod in a
// microVM and formats and mounts on the host for any other. mounted stands in for the host mounts an
// unchanged driver makes (the example runs without root).
type stepsDriver struct {
	crust    *client.Client
	deferral client.Deferral
	devices  string   // where the volumes' devices are (image files here)
	mounted  []string // what the driver mounted on the host
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

// NodePublishVolume, steps 3 and 4: per pod, a deposit instead of the bind mount, or the format and mount
// that the stage skipped.
func (d *stepsDriver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	decision, _, err := d.deferral.Decide(ctx, req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	pod := client.PodInfo(req.GetVolumeContext()).Name
	switch decision {
	case client.Defer:
		if err := os.MkdirAll(req.GetTargetPath(), 0o750); err != nil {
			return nil, err
		}
		return d.crust.Publish(ctx, req, filepath.Join(d.devices, req.GetVolumeId()+".img"), client.CreateFilesystem(), fileType)
	case client.HostMount:
		d.mounted = append(d.mounted, req.GetVolumeId()+" formatted and mounted for "+pod) // the device, at the target
	default:
		d.mounted = append(d.mounted, req.GetVolumeId()+" published for "+pod) // the driver's own bind mount
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume, step 5: crustd answers for the paths it holds.
func (d *stepsDriver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if held, err := d.crust.Holds(ctx, req.GetTargetPath()); err != nil || held {
		if err != nil {
			return nil, err
		}
		return d.crust.Unpublish(ctx, req)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil // the driver's own unmount
}

// podHandlers is a client.PodRuntimes from a map of pod name to runtime handler; a driver asks its pod
// and RuntimeClass informers instead.
type podHandlers map[string]string

func (p podHandlers) RuntimeHandler(pod client.Pod) (string, bool) {
	h, ok := p[pod.Name]
	return h, ok
}

// The steps of docs/driver-authors.md, as a driver written from the page runs them for a volume of a
// deferring class and one of an ordinary class, each published to a pod of a microVM RuntimeClass and to
// a pod that names none: only the microVM pod's volume of the deferring class reaches crustd, and nothing
// of that volume is mounted on the host for it; the other pod gets it formatted and mounted on the host.
func Example_driverSteps() {
	ctx := context.Background()
	crust, err := client.New(crustd.SocketFromEnv(), client.WithDriverName("steps.example.com"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = crust.Close() }()
	d := &stepsDriver{crust: crust, devices: imageDir, deferral: client.Deferral{
		Handlers: client.Handlers{"kata", "kata-*", "crust-microvm"},
		Pods:     podHandlers{"vm": "crust-microvm", "app": ""},
	}}
	mount := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	pods := map[string]string{"vm": "0f1e2d3c-0000-4000-8000-00000000005e", "app": "0f1e2d3c-0000-4000-8000-00000000005f"}
	for _, uid := range pods {
		defer func() { _ = os.RemoveAll(filepath.Join(kubeletDir, "pods", uid)) }()
	}
	for _, class := range []map[string]string{
		{volume.DeferKey: "true", volume.TotalIOPSKey: "500", "vg": "vg0"}, // a deferring StorageClass
		{"vg": "vg0"}, // an ordinary one
	} {
		cv, _ := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("pv-%d", len(class)), Parameters: class})
		id, volCtx := cv.GetVolume().GetVolumeId(), cv.GetVolume().GetVolumeContext()
		fmt.Printf("%s: volume context %v\n", id, volCtx)
		device := filepath.Join(imageDir, id+".img")
		_ = os.WriteFile(device, nil, 0o600)
		_ = os.Truncate(device, 64<<20)
		defer func() { _ = os.Remove(device) }()
		_, _ = d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/staging/" + id,
			VolumeCapability: mount, VolumeContext: volCtx})
		for _, pod := range []string{"vm", "app"} {
			dir := filepath.Join(kubeletDir, "pods", pods[pod], "volumes", "kubernetes.io~csi", id)
			_ = os.MkdirAll(dir, 0o750)
			target := filepath.Join(dir, "mount")
			// Kubelet adds the pod's information (podInfoOnMount) to the volume context it publishes with.
			withPod := maps.Clone(volCtx)
			withPod[volume.PodNameKey], withPod[volume.PodNamespaceKey], withPod[volume.PodUIDKey] = pod, "default", pods[pod]
			if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target,
				VolumeCapability: mount, VolumeContext: withPod}); err != nil {
				fmt.Println(id, pod, "publish:", err)
				continue
			}
			held, _ := crust.Holds(ctx, target)
			_, _ = d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			after, _ := crust.Holds(ctx, target)
			fmt.Printf("%s for pod %s: held by crustd %v, after unpublish %v\n", id, pod, held, after)
		}
	}
	fmt.Printf("mounted on the host: %q\n", d.mounted)
	// Output:
	// pv-3: volume context map[crust.dev/defer:true crust.dev/total-iops:500]
	// pv-3 for pod vm: held by crustd true, after unpublish false
	// pv-3 for pod app: held by crustd false, after unpublish false
	// pv-1: volume context map[]
	// pv-1 for pod vm: held by crustd false, after unpublish false
	// pv-1 for pod app: held by crustd false, after unpublish false
	// mounted on the host: ["pv-3 formatted and mounted for app" "pv-1 staged" "pv-1 published for vm" "pv-1 published for app"]
}
