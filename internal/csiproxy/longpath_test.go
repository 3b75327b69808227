package csiproxy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/katadir"
)

// TestDeferredEventCarriesKataCaveats: a PersistentVolume named with 253 characters (the longest name
// Kubernetes allows) makes a target path too long for a Kata directory name. The proxy defers it all the
// same, crustd holds it, and the pod's VolumeDeferred Event carries the Kata caveats crustd answered, so
// that `kubectl describe pod` says why a Kata runtime will not find the volume.
func TestDeferredEventCarriesKataCaveats(t *testing.T) {
	e := newEnv(t)
	const uid = "0e0e0e0e-0000-4000-8000-000000000009"
	kataClass := "kata-qemu-class"
	cs := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: uid},
			Spec: corev1.PodSpec{NodeName: "n1", RuntimeClassName: &kataClass}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: kataClass}, Handler: "kata-qemu"},
	)
	node := nodeProxy(t, e, cs)
	ctx := context.Background()

	vol := e.createVolume("pvc-long", 64<<20, true)
	pv := "pv-" + strings.Repeat("l", 250)
	staging, target := e.staging("pv-long"), e.target(uid, pv)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: xfsCap(""), VolumeContext: podContext(vol, "ns", "vm", uid)}); err != nil {
		t.Fatalf("publish of a %d-byte target path: %v", len(target), err)
	}
	got, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if err != nil {
		t.Fatalf("crustd does not hold the volume: %v", err)
	}
	if c := got.GetVolume().GetKataCaveats(); !slices.Equal(c, []string{katadir.PathTooLongCaveat}) {
		t.Fatalf("kata_caveats %q, want the caveat of a path Kata cannot name", c)
	}
	waitEvent(t, cs, "vm", ReasonDeferred, "Kata caveats: "+katadir.PathTooLongCaveat)

	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
