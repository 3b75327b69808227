package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Storage capacity tracking: a pod whose generic ephemeral volume is larger than the free space of the
// node's volume group stays Pending with the scheduler's capacity reason, and runs once space is freed.
func TestCapacityAwareScheduling(t *testing.T) {
	c, ctx, ns := begin(t)
	ephemeral := func(size string) corev1.Volume {
		class := deferClass
		return corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
			VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
			}},
		}}}
	}
	capacity := func() (int64, error) {
		l, err := c.cs.StorageV1().CSIStorageCapacities("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		for _, sc := range l.Items {
			if sc.StorageClassName == deferClass && sc.Capacity != nil {
				return sc.Capacity.Value(), nil
			}
		}
		return 0, fmt.Errorf("no CSIStorageCapacity for %s among %d", deferClass, len(l.Items))
	}
	var free int64
	waitFor(t, time.Minute, "the class's CSIStorageCapacity", func() (bool, error) {
		var err error
		free, err = capacity()
		return err == nil && free > 6<<30, fmt.Errorf("free %d: %v", free, err)
	})
	t.Logf("free in the volume group: %d bytes", free)
	// A microVM pod (deferred: nothing is formatted on the host) takes most of it.
	hog := free - 2<<30
	c.runPod(t, ns, podSpec("hog", microVMClass, nil, ephemeral(resource.NewQuantity(hog, resource.BinarySI).String())))
	waitFor(t, time.Minute, "the capacity to show the hog's volume", func() (bool, error) {
		f, err := capacity()
		return err == nil && f < 3<<30, fmt.Errorf("free %d: %v", f, err)
	})
	t0 := time.Now()
	c.createPod(t, ns, podSpec("big", microVMClass, nil, ephemeral("4Gi")))
	waitFor(t, 2*time.Minute, "the scheduler to refuse for storage", func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "enough free storage") {
				t.Logf("pending: %s", cond.Message)
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions)
	})
	if p, err := c.cs.CoreV1().Pods(ns).Get(ctx, "big", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("the big pod was placed on %q (%v)", p.Spec.NodeName, err)
	}
	t1 := time.Now()
	c.deletePod(t, ns, "hog")
	c.waitRunning(t, ns, "big")
	t.Logf("pending %s; running %s after the space was freed", t1.Sub(t0).Round(100*time.Millisecond), time.Since(t1).Round(100*time.Millisecond))
	c.deletePod(t, ns, "big")
}
