package cluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"crust.dev/crust/api/crustd"
)

// A static PersistentVolume of the deferring class, with no volume attributes (so no crust.dev/defer in
// the volume context kubelet sends), is deferred all the same: the node proxy finds its StorageClass
// through the PV.
func TestStaticPVDefers(t *testing.T) {
	c, ctx, ns := begin(t)
	// The volume an administrator made earlier: asked of the driver itself, as block, on its controller
	// socket (behind the controller proxy, in the controller pod's socket directory).
	ctrl := c.driverController(t)
	cv, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "static-" + ns,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if err != nil {
		t.Fatal(err)
	}
	id := cv.GetVolume().GetVolumeId()
	pvName := "static-" + ns
	deleted := false
	cleanup := func() {
		if deleted {
			return
		}
		deleted = true
		_ = c.cs.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{})
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("delete the static volume: %v", err)
		}
	}
	t.Cleanup(cleanup)

	class := deferClass
	if _, err := c.cs.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: id, FSType: "ext4"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "static"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class, VolumeName: pvName,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := c.runPod(t, ns, podSpec("vm", microVMClass, nil, claimVolume("data", "static")))
	held := c.podVolumes(t, string(pod.UID))
	if len(held) != 1 || held[0].GetSpec().GetVolumeId() != id {
		t.Fatalf("crustd holds %v for the pod of a static PV, want its volume %s deferred", held, id)
	}
	assertEmptyTarget(t, c, held[0].GetSpec().GetVolumeTargetPath())

	c.deletePod(t, ns, "vm")
	if err := c.cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "static", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the PVC gone", func() (bool, error) {
		_, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "static", metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	cleanup()
}

// driverController is a Controller client on the example driver's own socket, in its controller pod.
// The path inside the node's mount namespace is longer than a unix socket address may be, so the client
// dials it through a short symbolic link.
func (c *cluster) driverController(t *testing.T) csi.ControllerClient {
	t.Helper()
	pods, err := c.cs.CoreV1().Pods("").List(ctxT(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=crust-lvm-csi,app.kubernetes.io/component=controller"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("controller pods: %v, %v", pods, err)
	}
	dir := c.nsPath(filepath.Join("/var/lib/kubelet/pods", string(pods.Items[0].UID), "volumes/kubernetes.io~empty-dir/socket-dir"))
	link := filepath.Join(t.TempDir(), "s")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	conn, err := crustd.Dial(filepath.Join(link, "lvm-csi.sock")) // the driver's own, not the injected proxy's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return csi.NewControllerClient(conn)
}
