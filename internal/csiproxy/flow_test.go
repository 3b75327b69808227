package csiproxy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/internal/testutil/sandbox"
)

func xfsCap(group string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs",
			MountFlags: []string{"noatime"}, VolumeMountGroup: group}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// podContext is a volume context as kubelet sends it with podInfoOnMount.
func podContext(vol *csi.Volume, ns, name, uid string) map[string]string {
	vc := map[string]string{podNamespaceKey: ns, podNameKey: name, podUIDKey: uid}
	for k, v := range vol.GetVolumeContext() {
		vc[k] = v
	}
	return vc
}

// TestDeferredAndHostMount is one StorageClass (crust.dev/defer: "true") serving both kinds of pod, with
// pod look-ups through the informer code on client-go's fake clientset (no API server runs here): a runc
// pod gets the volume formatted and mounted on the host by the proxy and writes data; a microVM pod then
// gets it deferred (the descriptor in crustd, the target an empty directory under the read-only guard),
// and the sandbox stand-in claims it, sees the runc pod's data, writes its own; stats and online expansion
// go through crustd to the sandbox; then the runc pod sees the sandbox's data. Nothing is left at the end.
func TestDeferredAndHostMount(t *testing.T) {
	e := newEnv(t)
	kataClass := "kata-qemu-class"
	onRootMismatch := &corev1.PodSecurityContext{FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch)}
	cs := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "0e0e0e0e-0000-4000-8000-000000000001"},
			Spec: corev1.PodSpec{NodeName: "n1", SecurityContext: onRootMismatch}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "0e0e0e0e-0000-4000-8000-000000000002"},
			Spec: corev1.PodSpec{NodeName: "n1", RuntimeClassName: &kataClass, SecurityContext: onRootMismatch}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: kataClass}, Handler: "kata-qemu"},
	)
	node := nodeProxy(t, e, cs)
	ctx := context.Background()

	vol := e.createVolume("pvc-both", 320<<20, true)
	if vol.GetVolumeContext()[DeferKey] != "true" {
		t.Fatalf("the driver's volume context %v lacks %s", vol.GetVolumeContext(), DeferKey)
	}
	staging := e.staging("pv-both")
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(staging); len(m) != 0 {
		t.Fatalf("staged for deferral, yet the staging path is mounted: %v", m)
	}

	// 1. The runc pod: formatted and mounted on the host by the proxy, fsGroup applied under the pod's
	// fsGroupChangePolicy, which kubelet does not send.
	runcTarget := e.target("0e0e0e0e-0000-4000-8000-000000000001", "pv-both")
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: runcTarget,
		VolumeCapability: xfsCap("2000"), VolumeContext: podContext(vol, "ns", "web", "0e0e0e0e-0000-4000-8000-000000000001")}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	var rootSt unix.Stat_t
	if err := unix.Stat(runcTarget, &rootSt); err != nil || rootSt.Gid != 2000 || rootSt.Mode&unix.S_ISGID == 0 {
		t.Fatalf("the volume's root after publish with fsGroup 2000: gid %d, mode %o, %v", rootSt.Gid, rootSt.Mode, err)
	}
	// A file of another group: with OnRootMismatch the repeat finds the root right and walks no further
	// (with Always it would take group 2000).
	otherGroup := filepath.Join(runcTarget, "other-group")
	if err := os.WriteFile(otherGroup, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(otherGroup, -1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil { // a repeat: changes nothing
		t.Fatal(err)
	}
	if err := unix.Stat(otherGroup, &rootSt); err != nil || rootSt.Gid != 1 {
		t.Fatalf("a repeat publish of a pod with fsGroupChangePolicy OnRootMismatch walked the volume: the file's gid is %d (%v), want 1", rootSt.Gid, err)
	}
	if m := mountsUnder(runcTarget); len(m) != 1 {
		t.Fatalf("runc pod's target mounts: %v, want one", m)
	}
	// The driver published the raw device beside kubelet's target, where a driver that sees only
	// <kubelet>/pods sees it.
	if fi, err := os.Stat(filepath.Join(filepath.Dir(runcTarget), privateBlockDir, "dev")); err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Fatalf("no block device at the private path beside the target: %v, %v", fi, err)
	}
	if fs := strings.TrimSpace(sh(t, "findmnt", "-n", "-o", "FSTYPE", runcTarget)); fs != "xfs" {
		t.Fatalf("runc pod's target holds %q, want xfs", fs)
	}
	// The proxy's host mounts carry no device files and no set-user-id programs into the pod.
	if opts := strings.Split(strings.TrimSpace(sh(t, "findmnt", "-n", "-o", "OPTIONS", runcTarget)), ","); !slices.Contains(opts, "nodev") || !slices.Contains(opts, "nosuid") {
		t.Fatalf("host mount options %v, want nodev and nosuid", opts)
	}
	var st os.FileInfo
	if err := os.WriteFile(filepath.Join(runcTarget, "from-runc"), []byte("hello from runc"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, _ = os.Stat(runcTarget); st == nil || st.Sys() == nil {
		t.Fatal("stat target")
	}
	stats, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: runcTarget})
	if err != nil || len(stats.GetUsage()) != 2 || stats.GetUsage()[0].GetTotal() < 200<<20 {
		t.Fatalf("host-mounted stats: %v, %v", stats, err)
	}
	if l, _ := e.crust.ListVolumes(ctx, &crustv1.ListVolumesRequest{}); len(l.GetVolumes()) != 0 {
		t.Fatalf("a runc pod's volume reached crustd: %v", l.GetVolumes())
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: runcTarget}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(runcTarget); !os.IsNotExist(err) {
		t.Fatalf("runc target left behind: %v", err)
	}

	waitEvent(t, cs, "web", ReasonHostMounted, "pod has no runtimeClassName")

	// 2. The microVM pod: deferred.
	vmTarget := e.target("0e0e0e0e-0000-4000-8000-000000000002", "pv-both")
	pub.TargetPath, pub.VolumeContext, pub.VolumeCapability = vmTarget, podContext(vol, "ns", "vm", "0e0e0e0e-0000-4000-8000-000000000002"), xfsCap("3000")
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, cs, "vm", ReasonDeferred, "kata-qemu is a microVM handler")
	if entries, err := os.ReadDir(vmTarget); err != nil || len(entries) != 0 {
		t.Fatalf("deferred target: %v, %v; want an empty directory", entries, err)
	}
	if on, err := guarded(vmTarget); err != nil || !on || len(mountsUnder(vmTarget)) != 1 {
		t.Fatalf("deferred target: mounts %v, guarded %v (%v); want the read-only guard alone", mountsUnder(vmTarget), on, err)
	}
	got, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: vmTarget})
	if err != nil {
		t.Fatal(err)
	}
	spec := got.GetVolume().GetSpec()
	if spec.GetFsType() != "xfs" || !spec.GetCreateFilesystem() || spec.GetVolumeSupplementalGroup() != 3000 ||
		spec.GetSupplementalGroupChangePolicy() != crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH ||
		spec.GetVolumeId() != vol.GetVolumeId() || spec.GetPodUid() != "0e0e0e0e-0000-4000-8000-000000000002" || spec.GetCsiDriver() != e.driverName ||
		len(spec.GetMountFlags()) != 1 || spec.GetMountFlags()[0] != "noatime" || spec.GetReadOnly() {
		t.Fatalf("descriptor %v", got.GetVolume())
	}
	// Calls naming another volume never act on this one's path: NOT_FOUND, and it stays deferred.
	other := "csi-0000000000000000000000000000000000000000"
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: other, TargetPath: vmTarget}); status.Code(err) != codes.NotFound {
		t.Fatalf("unpublish of another volume's target: %v, want NOT_FOUND", err)
	}
	if _, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: other, VolumePath: vmTarget}); status.Code(err) != codes.NotFound {
		t.Fatalf("stats of another volume's target: %v, want NOT_FOUND", err)
	}
	if _, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: other, VolumePath: vmTarget,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}}); status.Code(err) != codes.NotFound {
		t.Fatalf("expand of another volume's target: %v, want NOT_FOUND", err)
	}
	if _, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: vmTarget}); err != nil {
		t.Fatalf("the deferred volume is gone after calls for another volume: %v", err)
	}
	// The same target asked read-only: ALREADY_EXISTS, and the volume stays as it was.
	ro := proto.Clone(pub).(*csi.NodePublishVolumeRequest)
	ro.Readonly = true
	if _, err := node.NodePublishVolume(ctx, ro); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("read-only publish over a published target: %v, want ALREADY_EXISTS", err)
	}
	if _, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: vmTarget}); err != nil {
		t.Fatalf("the descriptor is gone after a refused repeat: %v", err)
	}
	// Before a sandbox claims it, stats come from the device: its size, usage unknown.
	pre, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: vmTarget})
	if u := pre.GetUsage(); err != nil || len(u) != 1 || u[0].GetUnit() != csi.VolumeUsage_BYTES ||
		u[0].GetTotal() != vol.GetCapacityBytes() || u[0].GetUsed() != 0 {
		t.Fatalf("stats of an unclaimed deferred volume: %v, %v; want the device's %d bytes, usage unknown", pre, err, vol.GetCapacityBytes())
	}
	sb := sandbox.New(t, e.crustSock, "sandbox-1")
	guest := sb.Start(vmTarget)
	if b, err := os.ReadFile(filepath.Join(guest, "from-runc")); err != nil || string(b) != "hello from runc" {
		t.Fatalf("the sandbox does not see the runc pod's data: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(guest, "from-vm"), make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	stats, err = node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: vmTarget})
	if err != nil || len(stats.GetUsage()) != 2 || stats.GetUsage()[0].GetUsed() < 8<<20 {
		t.Fatalf("deferred stats through crustd: %v, %v", stats, err)
	}
	before := stats.GetUsage()[0].GetTotal()
	// Online expansion: the controller grows the volume, the node call goes to the sandbox.
	if _, err := e.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 400 << 20}}); err != nil {
		t.Fatal(err)
	}
	exp, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.GetVolumeId(), VolumePath: vmTarget,
		StagingTargetPath: staging, VolumeCapability: xfsCap(""), CapacityRange: &csi.CapacityRange{RequiredBytes: 400 << 20}})
	if err != nil || exp.GetCapacityBytes() <= before {
		t.Fatalf("deferred expansion: %v, %v (before %d)", exp, err, before)
	}
	sb.Stop(vmTarget)
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: vmTarget}); err != nil {
		t.Fatal(err)
	}

	// 3. The runc pod again: the sandbox's data, and the grown filesystem.
	pub.TargetPath, pub.VolumeContext, pub.VolumeCapability = runcTarget, podContext(vol, "ns", "web", "0e0e0e0e-0000-4000-8000-000000000001"), xfsCap("")
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(runcTarget, "from-vm")); err != nil || fi.Size() != 8<<20 {
		t.Fatalf("the runc pod does not see the sandbox's data: %v, %v", fi, err)
	}
	stats, err = node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: runcTarget})
	if err != nil || stats.GetUsage()[0].GetTotal() != exp.GetCapacityBytes() {
		t.Fatalf("host stats after the sandbox grew it: %v, %v; want total %d", stats, err, exp.GetCapacityBytes())
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: runcTarget}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

// stageAndPublish stages vol at staging and publishes it at target through node, with mountCap and the
// volume context the driver answered, and fails tb on an error.
func stageAndPublish(tb testing.TB, node csi.NodeClient, vol *csi.Volume, staging, target string) {
	tb.Helper()
	ctx := context.Background()
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: mountCap(), VolumeContext: vol.GetVolumeContext()}); err != nil {
		tb.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap(), VolumeContext: vol.GetVolumeContext()}); err != nil {
		tb.Fatal(err)
	}
}

// published starts a proxy on a new env, creates volume pv (deferrable when asked), and stages and
// publishes it for pod podUID; it returns the env, the proxy's Node client, the volume and its paths.
func published(t *testing.T, pv, podUID string, deferrable bool) (e *env, node csi.NodeClient, vol *csi.Volume, staging, target string) {
	t.Helper()
	e = newEnv(t)
	node = csi.NewNodeClient(startProxy(t, e.config(), e.log))
	vol = e.createVolume("pvc-"+pv, 64<<20, deferrable)
	staging, target = e.staging("pv-"+pv), e.target(podUID, "pv-"+pv)
	stageAndPublish(t, node, vol, staging, target)
	return e, node, vol, staging, target
}

// TestNotDeferredStaysOnTheDriver: a volume without the flag is the driver's business alone.
func TestNotDeferredStaysOnTheDriver(t *testing.T) {
	e, node, vol, staging, target := published(t, "plain", "0e0e0e0e-0000-4000-8000-000000000003", false)
	ctx := context.Background()
	if len(mountsUnder(staging)) != 1 || len(mountsUnder(target)) != 1 {
		t.Fatalf("the driver's own mounts are missing: %v", mountsUnder(e.kubelet))
	}
	if recs := e.stateRecords(); len(recs) != 0 {
		t.Fatalf("the proxy recorded a pass-through volume: %v", recs)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

func (e *env) stateRecords() []string {
	names, _ := os.ReadDir(filepath.Join(e.state, "records"))
	var out []string
	for _, n := range names {
		out = append(out, n.Name())
	}
	return out
}

// TestFinalErrorUndoes: when a deferred publish fails with a final code (crustd refuses the fs type),
// kubelet will not unpublish, so the proxy undoes the driver's raw block publish and its record itself.
// The failure is counted.
func TestFinalErrorUndoes(t *testing.T) {
	e := newEnv(t)
	p, cc := runProxy(t, e.config(), e.log, Deps{})
	node := csi.NewNodeClient(cc)
	ctx := context.Background()
	vol := e.createVolume("pvc-refused", 64<<20, true)
	staging, target := e.staging("pv-refused"), e.target("0e0e0e0e-0000-4000-8000-0000000000c1", "pv-refused")
	capVfat := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "vfat"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: capVfat, VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: capVfat, VolumeContext: vol.GetVolumeContext()})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "crustd") {
		t.Fatalf("publish with an fs type crustd refuses: %v, want crustd's INVALID_ARGUMENT", err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("target left after a refused publish: %v", err)
	}
	if err := promtestutil.GatherAndCompare(p.metrics.Registry, strings.NewReader(`
# HELP crust_csi_proxy_publish_failures_total NodePublishVolume calls crust-csi-proxy deferred or mounted on the host that failed, by mode (deferred, host); each is also a VolumeDeferralFailed event on the pod, or a VolumeHeldByAnotherPod event when another pod holds the volume.
# TYPE crust_csi_proxy_publish_failures_total counter
crust_csi_proxy_publish_failures_total{mode="deferred"} 1
`), "crust_csi_proxy_publish_failures_total"); err != nil {
		t.Errorf("the failed deferral is not counted: %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

// waitEvent waits until the proxy has recorded an event with reason on pod ns/name whose message holds
// want.
func waitEvent(t *testing.T, cs kubernetes.Interface, name, reason, want string) {
	t.Helper()
	var seen []string
	ctx, cancel := harness.Context(t, 10*time.Second)
	defer cancel()
	if harness.Poll(ctx, func() (bool, error) {
		evs, err := cs.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range evs.Items {
			seen = append(seen, ev.InvolvedObject.Name+" "+ev.Reason+": "+ev.Message)
			if ev.InvolvedObject.Kind == "Pod" && ev.InvolvedObject.Name == name && ev.Reason == reason && strings.Contains(ev.Message, want) {
				return true, nil
			}
		}
		return false, nil
	}) == nil {
		return
	}
	t.Fatalf("no event %s on pod %s with %q; events: %v", reason, name, want, seen)
}

// nodeProxy runs a node proxy in front of e's driver and crustd, on node n1, with kata-qemu a microVM
// handler and pods and RuntimeClasses from cs.
func nodeProxy(t *testing.T, e *env, cs *fake.Clientset) csi.NodeClient {
	t.Helper()
	cfg := e.config()
	cfg.MicroVMHandlers, cfg.NodeName = []string{"kata-qemu"}, "n1"
	_, cc := runProxy(t, cfg, e.log, Deps{Clientset: cs})
	return csi.NewNodeClient(cc)
}

// TestHostMountGrowsOffline: a volume expanded while no pod used it (the controller grew the device) is
// mounted on the host with its ext4 already grown to the device, before any NodeExpandVolume; kubelet's
// NodeExpandVolume after the mount then has nothing left to do. That is what makes offline expansion
// work on a node that does not give CAP_SYS_RESOURCE, which growing a mounted ext4 needs.
func TestHostMountGrowsOffline(t *testing.T) {
	e := newEnv(t)
	const uid = "0e0e0e0e-0000-4000-8000-000000000003"
	cs := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: uid}, Spec: corev1.PodSpec{NodeName: "n1"}})
	node := nodeProxy(t, e, cs)
	ctx := context.Background()

	vol := e.createVolume("pvc-grow", 64<<20, true)
	staging, target := e.staging("pv-grow"), e.target(uid, "pv-grow")
	capability := mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: capability, VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: capability, VolumeContext: podContext(vol, "ns", "web", uid)}
	total := func() int64 {
		t.Helper()
		var st unix.Statfs_t
		if err := unix.Statfs(target, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks) * st.Bsize
	}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if got := total(); got > 64<<20 {
		t.Errorf("a 64 MiB volume's filesystem is %d bytes", got)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 192 << 20}}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	// ext4 keeps some blocks for its own metadata: well over the old size is what matters.
	if got := total(); got < 160<<20 {
		t.Errorf("after an offline expansion to 192 MiB, the filesystem mounted is %d bytes: not grown at mount", got)
	}
	exp, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.GetVolumeId(), VolumePath: target,
		StagingTargetPath: staging, VolumeCapability: capability, CapacityRange: &csi.CapacityRange{RequiredBytes: 192 << 20}})
	if err != nil || exp.GetCapacityBytes() < 192<<20 {
		t.Errorf("NodeExpandVolume after the mount: %v, %v", exp, err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}
