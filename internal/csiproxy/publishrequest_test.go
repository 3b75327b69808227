package csiproxy

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// newPublishRequest works out each fact of a request once: read-only from the readonly flag or a
// reader-only access mode, the filesystem type with its default, the flags as given, the group (an error
// kept for where the group is needed), block or mount, the pod and whether deferral is asked.
func TestNewPublishRequest(t *testing.T) {
	mount := func(m *csi.VolumeCapability_MountVolume, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: m},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	}
	const writer = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	gid := func(n int64) *int64 { return &n }
	podCtx := map[string]string{DeferKey: "true", podNamespaceKey: "ns", podNameKey: "p", podUIDKey: "u"}
	for _, tc := range []struct {
		name     string
		r        *csi.NodePublishVolumeRequest
		want     publishRequest // sent, req and gidErr are checked apart
		groupErr bool
	}{
		{"defaults", &csi.NodePublishVolumeRequest{VolumeCapability: mount(&csi.VolumeCapability_MountVolume{}, writer)},
			publishRequest{mount: true, fsType: volume.DefaultFSType}, false},
		{"readonly flag", &csi.NodePublishVolumeRequest{Readonly: true, VolumeCapability: mount(&csi.VolumeCapability_MountVolume{FsType: "xfs"}, writer)},
			publishRequest{mount: true, readOnly: true, fsType: "xfs"}, false},
		{"single reader", &csi.NodePublishVolumeRequest{VolumeCapability: mount(&csi.VolumeCapability_MountVolume{},
			csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)},
			publishRequest{mount: true, readOnly: true, fsType: volume.DefaultFSType}, false},
		{"multi reader", &csi.NodePublishVolumeRequest{VolumeCapability: mount(&csi.VolumeCapability_MountVolume{},
			csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)},
			publishRequest{mount: true, readOnly: true, fsType: volume.DefaultFSType}, false},
		{"flags and group", &csi.NodePublishVolumeRequest{VolumeCapability: mount(&csi.VolumeCapability_MountVolume{
			FsType: "ext3", MountFlags: []string{"noatime", "dev"}, VolumeMountGroup: "1000"}, writer)},
			publishRequest{mount: true, fsType: "ext3", mountFlags: []string{"noatime", "dev"}, gid: gid(1000)}, false},
		{"malformed group", &csi.NodePublishVolumeRequest{VolumeCapability: mount(&csi.VolumeCapability_MountVolume{VolumeMountGroup: "staff"}, writer)},
			publishRequest{mount: true, fsType: volume.DefaultFSType}, true},
		{"negative group", &csi.NodePublishVolumeRequest{VolumeCapability: mount(&csi.VolumeCapability_MountVolume{VolumeMountGroup: "-1"}, writer)},
			publishRequest{mount: true, fsType: volume.DefaultFSType}, true},
		{"block", &csi.NodePublishVolumeRequest{VolumeCapability: blockCap(), VolumeContext: podCtx},
			publishRequest{block: true, deferAsked: true, fsType: volume.DefaultFSType,
				pod: client.Pod{Namespace: "ns", Name: "p", UID: "u"}}, false},
		{"no capability", &csi.NodePublishVolumeRequest{VolumeContext: map[string]string{DeferKey: "false"}},
			publishRequest{fsType: volume.DefaultFSType}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := (&Proxy{}).newPublishRequest(context.Background(), tc.r)
			if pr.sent != tc.r || pr.req != tc.r {
				t.Errorf("sent, req = %p, %p; want the request itself, %p, for both", pr.sent, pr.req, tc.r)
			}
			if (pr.gidErr != nil) != tc.groupErr || (tc.groupErr && !errors.Is(pr.gidErr, errdefs.ErrInvalidArgument)) {
				t.Errorf("gidErr = %v; want an InvalidArgument: %v", pr.gidErr, tc.groupErr)
			}
			if !equalFacts(*pr, tc.want) {
				t.Errorf("facts = %+v\nwant    %+v", *pr, tc.want)
			}
		})
	}
}

// equalFacts compares two publishRequests' facts (not their requests, nor gidErr).
func equalFacts(a, b publishRequest) bool {
	sameGID := (a.gid == nil) == (b.gid == nil) && (a.gid == nil || *a.gid == *b.gid)
	return a.deferAsked == b.deferAsked && a.block == b.block && a.mount == b.mount && a.readOnly == b.readOnly &&
		a.fsType == b.fsType && slices.Equal(a.mountFlags, b.mountFlags) && sameGID && a.pod == b.pod
}

// The enriched request carries the StorageClass's crust keys, and the facts are read from it; the request
// as kubelet sent it, which the driver is given, is left as it was.
func TestNewPublishRequestEnriched(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset(
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "static"}, Spec: corev1.PersistentVolumeSpec{
			StorageClassName: "deferring", PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: "d.example", VolumeHandle: "h1"}}}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "deferring"}, Provisioner: "d.example",
			Parameters: map[string]string{DeferKey: "true", volume.TotalIOPSKey: "50", "type": "ssd"}},
	)
	p := &Proxy{classes: syncedInformers(ctx, t, cs), driverName: "d.example"}
	sent := &csi.NodePublishVolumeRequest{VolumeId: "h1", VolumeCapability: mountCap(),
		VolumeContext: map[string]string{podNamespaceKey: "ns", podNameKey: "p"}}
	before := maps.Clone(sent.GetVolumeContext())
	pr := p.newPublishRequest(ctx, sent)
	if pr.sent != sent || !maps.Equal(sent.GetVolumeContext(), before) {
		t.Errorf("sent = %v; want the request as it came", pr.sent)
	}
	want := map[string]string{podNamespaceKey: "ns", podNameKey: "p", DeferKey: "true", volume.TotalIOPSKey: "50"}
	if !maps.Equal(pr.volumeContext(), want) || pr.req.GetVolumeId() != "h1" {
		t.Errorf("enriched request %v; want volume h1 with context %v", pr.req, want)
	}
	if !pr.deferAsked || pr.pod != (client.Pod{Namespace: "ns", Name: "p"}) {
		t.Errorf("deferAsked %v, pod %+v; want true, ns/p", pr.deferAsked, pr.pod)
	}
}
