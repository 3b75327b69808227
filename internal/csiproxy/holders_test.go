package csiproxy

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/testutil/sandbox"
)

// TestOneWriterAcrossRuntimes runs the proxy with the example driver and a real crustd on one
// ReadWriteOnce volume used by runc pods (web, web2) and microVM pods (vm, vm2) on one node. While
// sandbox-1 of pod vm holds the volume, a runc pod's publish is FAILED_PRECONDITION naming pod ns/vm and
// its sandbox (a HeldError, and a VolumeHeldByAnotherPod Event that says the same), and leaves nothing (no
// mount, no record, no hold); so is another microVM pod's, refused at the deposit. Once vm is gone, web's publish is a host mount that crustd records as the node's hold;
// web2 shares it (one kernel); vm's publish is then refused naming the node and pod ns/web. A proxy that
// starts reconciles crustd's holds with its host mounts: a hold no host mount stands for ends, and one a
// host mount lacks is made again. Once the runc pods are gone, vm's publish succeeds.
func TestOneWriterAcrossRuntimes(t *testing.T) {
	e := newEnv(t)
	kata := "kata-qemu-class"
	uid := func(i int) string { return "0e0e0e0e-0000-4000-8000-00000000010" + string(rune('0'+i)) }
	pod := func(name string, i int, class *string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid(i))},
			Spec: corev1.PodSpec{NodeName: "n1", RuntimeClassName: class}}
	}
	cs := fake.NewClientset(pod("web", 1, nil), pod("web2", 2, nil), pod("vm", 3, &kata), pod("vm2", 4, &kata),
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: kata}, Handler: "kata-qemu"})
	cfg := e.config()
	cfg.MicroVMHandlers, cfg.NodeName = []string{"kata-qemu"}, "n1"
	p, cc := runProxy(t, cfg, e.log, Deps{Clientset: cs})
	node := csi.NewNodeClient(cc)
	ctx := context.Background()

	vol := e.createVolume("pvc-rwo", 320<<20, true) // xfs needs 300 MiB
	staging := e.staging("pv-rwo")
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	target := map[string]string{}
	publish := func(name string, i int) error {
		target[name] = e.target(uid(i), "pv-rwo")
		_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
			TargetPath: target[name], VolumeCapability: xfsCap(""), VolumeContext: podContext(vol, "ns", name, uid(i))})
		return err
	}
	unpublish := func(name string) {
		t.Helper()
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target[name]}); err != nil {
			t.Fatal(err)
		}
	}
	holds := func() []string {
		t.Helper()
		l, err := e.crust.ListNodeHolds(ctx, &crustv1.ListNodeHoldsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, h := range l.GetHolds() {
			out = append(out, h.GetPodName())
		}
		return out
	}
	refused := func(name string, i int, names ...string) {
		t.Helper()
		err := publish(name, i)
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("publish for pod %s: %v; want FAILED_PRECONDITION", name, err)
		}
		for _, n := range names {
			if !strings.Contains(err.Error(), n) {
				t.Fatalf("publish for pod %s: %v; want it to name %s", name, err, n)
			}
		}
		var held *errdefs.HeldError
		if !errors.As(errdefs.FromGRPC(err), &held) || !strings.Contains(held.Holder, names[0]) {
			t.Fatalf("publish for pod %s: %v; want a HeldError naming %s", name, err, names[0])
		}
		waitEvent(t, cs, name, ReasonHeld, names[0])
		if _, err := os.Lstat(target[name]); !os.IsNotExist(err) || p.journal.Get(KindPublish, target[name]) != nil {
			t.Fatalf("a refused publish for pod %s left its target (%v) or its record", name, err)
		}
	}

	if err := publish("vm", 3); err != nil {
		t.Fatal(err)
	}
	sb := sandbox.New(t, e.crustSock, "sandbox-1")
	guest := sb.Start(target["vm"])
	if err := os.WriteFile(guest+"/data", []byte("written in the sandbox"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused("web", 1, "pod ns/vm", `sandbox "sandbox-1"`)
	refused("vm2", 4, "pod ns/vm", `sandbox "sandbox-1"`)
	if h := holds(); len(h) != 0 {
		t.Fatalf("holds of the node's after refusals: %v", h)
	}
	if b, err := os.ReadFile(guest + "/data"); err != nil || string(b) != "written in the sandbox" {
		t.Fatalf("the sandbox's data after the refusals: %q, %v", b, err)
	}
	sb.Stop(target["vm"])
	unpublish("vm")

	for _, r := range []struct {
		name string
		i    int
	}{{"web", 1}, {"web2", 2}} {
		if err := publish(r.name, r.i); err != nil {
			t.Fatalf("publish for runc pod %s: %v", r.name, err)
		}
	}
	if b, err := os.ReadFile(target["web2"] + "/data"); err != nil || string(b) != "written in the sandbox" {
		t.Fatalf("the runc pod reads %q, %v; want the sandbox's data", b, err)
	}
	if h := holds(); strings.Join(h, ",") != "web,web2" {
		t.Fatalf("holds of the node's: %v; want web's and web2's", h)
	}
	refused("vm", 3, "the node", "pod ns/web")

	// Reconciliation: a hold nothing stands for ends; one a host mount lacks comes back.
	dev := p.journal.Get(KindPublish, target["web"]).Device
	stray := e.target(uid(5), "pv-rwo")
	if err := os.MkdirAll(stray, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := e.crust.HoldForNode(ctx, &crustv1.HoldForNodeRequest{Hold: &crustv1.NodeHold{VolumeTargetPath: stray,
		DevicePath: dev, PodName: "stray"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.crust.ReleaseFromNode(ctx, &crustv1.ReleaseFromNodeRequest{VolumeTargetPath: target["web2"]}); err != nil {
		t.Fatal(err)
	}
	if err := p.ReconcileHolds(ctx); err != nil {
		t.Fatal(err)
	}
	if h := holds(); strings.Join(h, ",") != "web," { // made again from the record, which knows the pod's UID alone
		t.Fatalf("holds after reconciliation: %q; want web's and web2's again, the stray one gone", h)
	}
	if err := os.Remove(stray); err != nil {
		t.Fatal(err)
	}

	unpublish("web")
	unpublish("web2")
	if h := holds(); len(h) != 0 {
		t.Fatalf("holds once the runc pods are gone: %v", h)
	}
	if err := publish("vm", 3); err != nil {
		t.Fatalf("publish for the microVM pod once the runc pods are gone: %v", err)
	}
	unpublish("vm")
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
