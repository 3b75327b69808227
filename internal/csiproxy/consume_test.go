package csiproxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/internal/testutil/sandbox"
)

// TestGuardedAndUnconsumed follows two pods of a microVM class whose runtime consumes nothing, with pod
// look-ups through the informer code on client-go's fake clientset. The deferred target of the pod
// without a subPath gets the guard (a retried publish stacks none), on which writes fail with EROFS; the
// pod with a subPath gets none. Once past the grace, each volume whose pod is Running and that no sandbox
// claims is reported once (a VolumeNotConsumed Event on its pod, saying where its writes go) and counted
// in crust_csi_proxy_unconsumed_volumes, which a claim takes back down. At unpublish the guard goes, and
// what the unguarded pod's runtime wrote into its target is moved into the quarantine, named in a
// VolumeDataQuarantined Event.
func TestGuardedAndUnconsumed(t *testing.T) {
	e := newEnv(t)
	kata := "kata-qemu-class"
	const vmUID, subUID = "0e0e0e0e-0000-4000-8000-0000000000e1", "0e0e0e0e-0000-4000-8000-0000000000e2"
	cs := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: vmUID},
			Spec:   corev1.PodSpec{NodeName: "n1", RuntimeClassName: &kata},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sub", UID: subUID},
			Spec: corev1.PodSpec{NodeName: "n1", RuntimeClassName: &kata, Containers: []corev1.Container{{Name: "c",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", SubPath: "sub"}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodPending}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: kata}, Handler: "kata-qemu"},
	)
	cfg := e.config()
	cfg.MicroVMHandlers, cfg.NodeName, cfg.UnconsumedGrace = []string{"kata-qemu"}, "n1", time.Minute
	p, cc := runProxy(t, cfg, e.log, Deps{Clientset: cs})
	node := csi.NewNodeClient(cc)
	ctx := context.Background()

	type published struct {
		vol             *csi.Volume
		staging, target string
		pub             *csi.NodePublishVolumeRequest
	}
	publish := func(pod, uid, pv string) published {
		t.Helper()
		v := published{vol: e.createVolume("pvc-"+pv, 64<<20, true), staging: e.staging(pv), target: e.target(uid, pv)}
		if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging,
			VolumeCapability: mountCap(), VolumeContext: v.vol.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		v.pub = &csi.NodePublishVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging, TargetPath: v.target,
			VolumeCapability: mountCap(), VolumeContext: podContext(v.vol, "ns", pod, uid)}
		if _, err := node.NodePublishVolume(ctx, v.pub); err != nil {
			t.Fatal(err)
		}
		return v
	}
	vm, sub := publish("vm", vmUID, "pv-vm"), publish("sub", subUID, "pv-sub")

	// The guard: on vm's target alone; a retried publish stacks none.
	if _, err := node.NodePublishVolume(ctx, vm.pub); err != nil {
		t.Fatal(err)
	}
	if on, err := guarded(vm.target); err != nil || !on || len(mountsUnder(vm.target)) != 1 {
		t.Fatalf("vm's target: guarded %v (%v), mounts %v; want the guard alone", on, err, mountsUnder(vm.target))
	}
	if err := os.WriteFile(filepath.Join(vm.target, "f"), nil, 0o600); !errors.Is(err, unix.EROFS) {
		t.Errorf("a write into the guarded target: %v, want EROFS", err)
	}
	if m := mountsUnder(sub.target); len(m) != 0 {
		t.Fatalf("the target of a pod with a subPath: mounts %v, want none (kubelet makes the subPath's directory in it)", m)
	}

	check := func(at time.Time, warn []string, unconsumed float64) {
		t.Helper()
		if got := p.checkConsumed(ctx, at); !slices.Equal(got, warn) {
			t.Fatalf("warned of %v, want %v", got, warn)
		}
		if n := metricValue(t, p, "crust_csi_proxy_unconsumed_volumes"); n != unconsumed {
			t.Fatalf("crust_csi_proxy_unconsumed_volumes %v, want %v", n, unconsumed)
		}
	}
	later := time.Now().Add(2 * time.Minute)
	check(time.Now(), nil, 0)            // within the grace
	check(later, []string{vm.target}, 1) // sub's pod is Pending
	check(later, nil, 1)                 // once per record
	waitEvent(t, cs, "vm", ReasonNotConsumed, "writes to the volume fail: the proxy made its target path read-only")

	pod, err := cs.CoreV1().Pods("ns").Get(ctx, "sub", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := cs.CoreV1().Pods("ns").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "sub's pod Running in the cache", func() bool {
		got, ok := p.pods.PodByUID(subUID)
		return ok && got.Phase == string(corev1.PodRunning) && got.SubPath
	})
	check(later, []string{sub.target}, 2)
	waitEvent(t, cs, "sub", ReasonNotConsumed, "land in its target path on the node's disk")

	sb := sandbox.New(t, e.crustSock, "sandbox-vm")
	sb.Start(vm.target)
	check(later, nil, 1)
	sb.Stop(vm.target)

	// sub's runtime wrote into the target on the node: moved into the quarantine at unpublish.
	mkdirs(t, sub.target, "sub")
	if err := os.WriteFile(filepath.Join(sub.target, "sub", "data"), []byte("on the node"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v := range []published{vm, sub} {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.vol.GetVolumeId(), TargetPath: v.target}); err != nil {
			t.Fatalf("unpublish %s: %v", v.target, err)
		}
		if _, err := os.Lstat(v.target); !os.IsNotExist(err) {
			t.Fatalf("%s after unpublish: %v, want it gone", v.target, err)
		}
	}
	moved, _ := filepath.Glob(filepath.Join(e.kubelet, QuarantineDir, subUID, sub.vol.GetVolumeId()+"-*"))
	if len(moved) != 1 {
		t.Fatalf("quarantined targets %v, want sub's", moved)
	}
	if b, err := os.ReadFile(filepath.Join(moved[0], "sub", "data")); err != nil || string(b) != "on the node" {
		t.Errorf("the quarantined file: %q, %v", b, err)
	}
	waitEvent(t, cs, "sub", ReasonDataQuarantined, "moved to "+moved[0])
	if _, err := os.Lstat(filepath.Join(e.kubelet, QuarantineDir, vmUID)); !os.IsNotExist(err) {
		t.Errorf("vm's guarded target was quarantined: %v", err)
	}
	check(later, nil, 0)
	for _, v := range []published{vm, sub} {
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.vol.GetVolumeId(), StagingTargetPath: v.staging}); err != nil {
			t.Fatal(err)
		}
	}
	e.assertClean()
}
