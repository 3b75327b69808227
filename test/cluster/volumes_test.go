package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A PVC of the deferring class, used first by a microVM pod and then by a runc pod, through kubelet,
// external-provisioner, external-resizer, the proxy, crustd and the crust-microvm containerd shim:
//   - the microVM pod runs in a guest (its kernel is not the node's); crustd holds the descriptor with the
//     pod's UID, claimed by the pod's sandbox; the host target is an empty directory with nothing mounted
//     on it; in the container the volume is mounted from a virtio disk, with the pod's fsGroup, and takes
//     the container's writes;
//   - kubelet's stats summary shows capacity and usage as the guest measures them;
//   - deleting the crustd pod, and restarting the proxy container, loses nothing: stats still work;
//   - online expansion through the PVC reaches the filesystem the container sees (df grows);
//   - deleting the pod removes the descriptor and leaves no VM, virtiofsd, state or mount on the node;
//   - a runc pod with fsGroup 2000 gets a host mount with the guest's data, in group 2000;
//   - deleting the PVC removes the logical volume.
func TestDeferredVolumeLifecycle(t *testing.T) {
	c, ctx, ns := begin(t)
	t0 := time.Now()
	claim := c.pvc(t, ns, "data", "256Mi")
	gid := int64(2000)
	pod := c.runPod(t, ns, podSpec("vm", microVMClass, &gid, claimVolume("data", "data")))
	t.Logf("microVM pod Running %s after the PVC was created", time.Since(t0).Round(100*time.Millisecond))
	uid := string(pod.UID)
	// The example driver returns no volume context; crust-csi-proxy --controller put the flag there.
	if p, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if pv, err := c.cs.CoreV1().PersistentVolumes().Get(ctx, p.Spec.VolumeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if pv.Spec.CSI == nil || pv.Spec.CSI.VolumeAttributes["crust.dev/defer"] != "true" {
		t.Fatalf("the PV's volume attributes lack crust.dev/defer: %v", pv.Spec.CSI)
	}

	t.Logf("kubectl describe pod: %s", c.waitPodEvent(t, ns, "vm", "VolumeDeferred", "crust-microvm is a microVM handler"))
	if out := c.kubectlOK(t, "-n", ns, "describe", "pod", "vm"); !strings.Contains(out, "VolumeDeferred") {
		t.Errorf("kubectl describe pod does not show the deferral:\n%s", out)
	}

	vols := c.podVolumes(t, uid)
	if len(vols) != 1 {
		t.Fatalf("crustd holds %d descriptors for pod %s, want 1", len(vols), uid)
	}
	target := vols[0].GetSpec().GetVolumeTargetPath()
	if !strings.HasPrefix(target, "/var/lib/kubelet/pods/"+uid+"/volumes/kubernetes.io~csi/") {
		t.Errorf("target path %s is not the pod's CSI volume path", target)
	}
	if vols[0].GetSpec().GetCsiDriver() != driverName || !vols[0].GetSpec().GetCreateFilesystem() {
		t.Errorf("descriptor: driver %q, create_filesystem %v", vols[0].GetSpec().GetCsiDriver(), vols[0].GetSpec().GetCreateFilesystem())
	}
	assertEmptyTarget(t, c, target)

	sandbox, handler := c.sandboxOf(t, uid)
	if handler != microVMClass {
		t.Fatalf("sandbox %s runs with handler %q, want %q", sandbox, handler, microVMClass)
	}
	if got := vols[0].GetClaim().GetSandboxId(); got != sandbox {
		t.Fatalf("claimed by %q, want the pod's sandbox %q", got, sandbox)
	}
	vm := c.shell(t, ns, "vm", "c")
	dev := assertInGuest(t, vm, "/data")
	if out := strings.Fields(vm.ExecOK("stat", "-c", "%g", "/data")); len(out) != 1 || out[0] != "2000" {
		t.Errorf("the volume's root in the container has group %v, want the pod's fsGroup 2000", out)
	}
	guestKernel := strings.TrimSpace(vm.ExecOK("uname", "-r"))
	t.Logf("in the container: guest kernel %s, /data mounted from %s", guestKernel, dev)
	// The container's stdout reaches kubectl logs; kubectl exec -it gets a terminal in the guest.
	if logs := c.kubectlOK(t, "-n", ns, "logs", "vm", "-c", "c"); !strings.Contains(logs, "kernel "+guestKernel) {
		t.Errorf("kubectl logs shows %q, want the guest's kernel %s", logs, guestKernel)
	}
	if out := c.kubectlTTY(t, "-n", ns, "exec", "-it", "vm", "-c", "c", "--", "sh", "-c", "tty; uname -r"); !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, guestKernel) {
		t.Errorf("kubectl exec -it: %q, want a terminal in the guest", out)
	}
	vm.ExecOK("sh", "-c", "echo written-in-the-guest > /data/hello && dd if=/dev/zero of=/data/fill bs=1M count=24 2>/dev/null && sync")
	assertEmptyTarget(t, c, target)

	// Usage as the guest measures it reaches kubelet.
	statsSeen := func(what string) {
		t.Helper()
		t1 := time.Now()
		total, used := guestStatfs(t, vm, "/data")
		waitFor(t, 90*time.Second, "kubelet's stats of the volume "+what, func() (bool, error) {
			s, ok := c.kubeletVolumeStats(t, uid)["data"]
			if !ok {
				return false, fmt.Errorf("no stats for volume data")
			}
			if s.PVCRef == nil || s.PVCRef.Name != "data" {
				return false, fmt.Errorf("pvcRef %v", s.PVCRef)
			}
			return s.CapacityBytes == total && near(s.UsedBytes, used, 1<<20),
				fmt.Errorf("kubelet: capacity %d used %d; guest: %d %d", s.CapacityBytes, s.UsedBytes, total, used)
		})
		t.Logf("stats %s visible in kubelet after %s (capacity %d, used %d)", what, time.Since(t1).Round(100*time.Millisecond), total, used)
	}
	statsSeen("after the first write")

	// crustd's pod deleted: the DaemonSet starts another, which finds the descriptor and the claim.
	c.deletePod(t, "crust-system", c.crustdPod(t).Name)
	c.kubectlOK(t, "-n", "crust-system", "rollout", "status", "daemonset/crustd", "--timeout=2m")
	if got := c.podVolumes(t, uid); len(got) != 1 || got[0].GetClaim().GetSandboxId() != sandbox {
		t.Fatalf("after crustd's restart: %v", got)
	}
	vm.ExecOK("sh", "-c", "dd if=/dev/zero of=/data/fill2 bs=1M count=8 2>/dev/null && sync")
	statsSeen("after crustd's pod was replaced")

	// The proxy container restarted (stopped as a crash would; kubelet starts it again).
	nodePod := c.driverNodePod(t)
	c.stopContainer(t, c.containerOf(t, string(nodePod.UID), "crust-csi-proxy"))
	waitFor(t, 2*time.Minute, "the proxy container restarted", func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(nodePod.Namespace).Get(ctx, nodePod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "crust-csi-proxy" {
				return s.RestartCount > 0 && s.Ready, fmt.Errorf("restarts %d ready %v", s.RestartCount, s.Ready)
			}
		}
		return false, nil
	})
	vm.ExecOK("sh", "-c", "rm /data/fill2 && sync")
	statsSeen("after the proxy restarted")

	// Online expansion: the PVC asks for more; the guest's filesystem grows.
	sizeBefore, _ := guestStatfs(t, vm, "/data")
	t1 := time.Now()
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}`)
	if _, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	want := resource.MustParse("512Mi")
	waitFor(t, 2*time.Minute, "the PVC's capacity to show 512Mi", func() (bool, error) {
		p, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got := p.Status.Capacity[corev1.ResourceStorage]
		return got.Cmp(want) >= 0, fmt.Errorf("capacity %s, conditions %v", got.String(), p.Status.Conditions)
	})
	t.Logf("expansion seen in the PVC status after %s", time.Since(t1).Round(100*time.Millisecond))
	if total, _ := guestStatfs(t, vm, "/data"); total < sizeBefore+200<<20 {
		t.Fatalf("the guest's filesystem has %d bytes after expansion from 256Mi to 512Mi, %d before", total, sizeBefore)
	}
	statsSeen("after expansion")
	if vol := c.podVolumes(t, uid); len(vol) != 1 {
		t.Fatalf("descriptors after expansion: %v", vol)
	}

	// The pod goes, and its VM with it (the shim releases its claims): nothing left on the node.
	c.deletePod(t, ns, "vm")
	if got := c.podVolumes(t, uid); len(got) != 0 {
		t.Fatalf("crustd still holds %v after the pod was deleted", got)
	}
	c.waitPodDirGone(t, uid)
	c.assertSandboxGone(t, sandbox)

	// A runc pod with fsGroup 2000, same PVC: mounted on the host by the proxy, the guest's data in it.
	runc := c.runPod(t, ns, podSpec("runc", runcClass, &gid, claimVolume("data", "data")))
	if got := c.podVolumes(t, string(runc.UID)); len(got) != 0 {
		t.Fatalf("a runc pod's volume was deferred: %v", got)
	}
	c.waitPodEvent(t, ns, "runc", "VolumeMountedOnHost", "runtime handler runc is not a microVM handler")
	if out := c.kubectlOK(t, "-n", ns, "exec", "runc", "--", "cat", "/data/hello"); strings.TrimSpace(out) != "written-in-the-guest" {
		t.Fatalf("the runc pod reads %q", out)
	}
	if out := c.kubectlOK(t, "-n", ns, "exec", "runc", "--", "stat", "-c", "%g", "/data/hello", "/data"); strings.Fields(out)[0] != "2000" || strings.Fields(out)[1] != "2000" {
		t.Fatalf("group of the volume's files: %q, want 2000", out)
	}
	if out := c.kubectlOK(t, "-n", ns, "exec", "runc", "--", "df", "-k", "/data"); !strings.Contains(out, "/data") {
		t.Fatalf("df: %s", out)
	}
	c.deletePod(t, ns, "runc")

	// Deleting the PVC removes the volume.
	pvName := claim.Name
	if p, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{}); err == nil {
		pvName = p.Spec.VolumeName
	}
	before := c.logicalVolumes(t)
	if err := c.cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the PV "+pvName+" deleted", func() (bool, error) {
		_, err := c.cs.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if after := c.logicalVolumes(t); len(after) != len(before)-1 {
		t.Fatalf("logical volumes before the PVC's deletion %v, after %v", before, after)
	}
}

// Generic ephemeral and CSI inline ephemeral volumes through the proxy, for a microVM pod (deferred,
// mounted in the guest) and a runc pod (mounted on the host); deleting the pods removes the
// descriptors, the generic volume's PVC and both logical volumes. The microVM pod has two containers:
// both mount the generic volume (one claim, one disk in the guest, what one writes the other reads),
// and the second mounts the inline volume read-only, which it cannot write while the first can.
func TestEphemeralVolumes(t *testing.T) {
	c, ctx, ns := begin(t)
	lvsBefore := len(c.logicalVolumes(t))
	class := deferClass
	vols := func() []corev1.Volume {
		return []corev1.Volume{
			{Name: "generic", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
				VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &class,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("128Mi")}},
				}},
			}}},
			{Name: "inline", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver:           driverName,
				VolumeAttributes: map[string]string{"crust.dev/defer": "true", "size": "96Mi"},
			}}},
		}
	}

	p := podSpec("vm", microVMClass, nil, vols()...)
	// A memory limit, which the shim adds to the guest's own 512 MiB.
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}
	second := p.Spec.Containers[0]
	second.Resources = corev1.ResourceRequirements{}
	second.Name = "d"
	second.VolumeMounts = []corev1.VolumeMount{{Name: "generic", MountPath: "/shared"}, {Name: "inline", MountPath: "/ro", ReadOnly: true}}
	p.Spec.Containers = append(p.Spec.Containers, second)
	vmPod := c.runPod(t, ns, p)
	uid := string(vmPod.UID)
	held := c.podVolumes(t, uid)
	if len(held) != 2 {
		t.Fatalf("crustd holds %d descriptors for the microVM pod, want 2: %v", len(held), held)
	}
	sandbox, _ := c.sandboxOf(t, uid)
	for _, v := range held {
		assertEmptyTarget(t, c, v.GetSpec().GetVolumeTargetPath())
		if got := v.GetClaim().GetSandboxId(); got != sandbox {
			t.Errorf("%s claimed by %q, want the pod's sandbox %q", v.GetSpec().GetVolumeTargetPath(), got, sandbox)
		}
	}
	vm, other := c.shell(t, ns, "vm", "c"), c.shell(t, ns, "vm", "d")
	for _, p := range []string{"/generic", "/inline"} {
		assertInGuest(t, vm, p)
		vm.ExecOK("sh", "-c", "echo ok > "+p+"/f && sync")
	}
	if a, b := assertInGuest(t, vm, "/generic"), assertInGuest(t, other, "/shared"); a != b {
		t.Errorf("the two containers mount the generic volume from %s and %s, want one disk", a, b)
	}
	if got := strings.TrimSpace(other.ExecOK("cat", "/shared/f")); got != "ok" {
		t.Errorf("the second container reads %q from the shared volume", got)
	}
	if _, err := other.Exec("touch", "/ro/x"); err == nil || !strings.Contains(err.Error(), "Read-only file system") {
		t.Errorf("a write to the read-only mount: %v, want Read-only file system", err)
	}
	// The guest has the pod's memory limit on top of its own: 640 MiB, of which its kernel shows 530 (a
	// guest of 512 MiB shows 405: both measured under TCG).
	var memKB int64
	if _, err := fmt.Sscanf(vm.ExecOK("grep", "MemTotal", "/proc/meminfo"), "MemTotal: %d kB", &memKB); err != nil || memKB < 470<<10 {
		t.Errorf("the guest has %d KiB of memory (%v), want the pod's 128Mi limit added to its 512 MiB", memKB, err)
	}
	if total, _ := guestStatfs(t, vm, "/inline"); total > 96<<20 || total < 64<<20 {
		t.Errorf("inline volume: %d bytes in the guest, want about 96Mi", total)
	}

	runcPod := c.runPod(t, ns, podSpec("runc", runcClass, nil, vols()...))
	if got := c.podVolumes(t, string(runcPod.UID)); len(got) != 0 {
		t.Fatalf("a runc pod's ephemeral volumes were deferred: %v", got)
	}
	for _, p := range []string{"/generic", "/inline"} {
		c.kubectlOK(t, "-n", ns, "exec", "runc", "--", "sh", "-c", "echo ok > "+p+"/f && grep -q ' "+p+" ' /proc/mounts")
	}
	c.assertPodNetworkInGuest(t, ns, vmPod, runcPod)
	if n := len(c.logicalVolumes(t)); n != lvsBefore+4 {
		t.Errorf("%d logical volumes with two pods of two ephemeral volumes each, want %d", n, lvsBefore+4)
	}

	c.deletePod(t, ns, "vm")
	c.deletePod(t, ns, "runc")
	if got := c.podVolumes(t, uid); len(got) != 0 {
		t.Fatalf("crustd still holds %v", got)
	}
	c.waitPodDirGone(t, uid)
	c.assertSandboxGone(t, sandbox)
	c.waitPodDirGone(t, string(runcPod.UID))
	waitFor(t, 2*time.Minute, "the ephemeral volumes removed", func() (bool, error) {
		pvcs, err := c.cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := len(c.logicalVolumes(t))
		return len(pvcs.Items) == 0 && n == lvsBefore, fmt.Errorf("%d PVCs, %d logical volumes (want %d)", len(pvcs.Items), n, lvsBefore)
	})
}

// A raw block PVC of the deferring class, for a microVM pod, passes through the proxies untouched: the
// pod gets the device, crustd holds nothing.
func TestRawBlockPassesThrough(t *testing.T) {
	c, ctx, ns := begin(t)
	class, mode := deferClass, corev1.PersistentVolumeBlock
	if _, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "raw"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := podSpec("vm", microVMClass, nil)
	p.Spec.Volumes = []corev1.Volume{claimVolume("raw", "raw")}
	p.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "raw", DevicePath: "/dev/crust-raw"}}
	pod := c.runPod(t, ns, p)
	if got := c.podVolumes(t, string(pod.UID)); len(got) != 0 {
		t.Fatalf("a raw block volume was deferred: %v", got)
	}
	if out := c.kubectlOK(t, "-n", ns, "exec", "vm", "--", "blockdev", "--getsize64", "/dev/crust-raw"); strings.TrimSpace(out) != strconv.Itoa(64<<20) {
		t.Fatalf("the pod's raw device has %q bytes, want %d", out, 64<<20)
	}
	pvc, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "raw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv, err := c.cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{}); err != nil || pv.Spec.CSI.VolumeAttributes["crust.dev/defer"] != "" {
		t.Fatalf("a raw block PV was marked for deferral: %v, %v", pv.Spec.CSI, err)
	}
}

// A deferral that fails is told on the pod: a deferring class with a mount option crustd refuses leaves
// the pod pending with a VolumeDeferralFailed event naming the field and the reason.
func TestDeferralFailureIsAnEvent(t *testing.T) {
	c, ctx, ns := begin(t)
	sc, err := c.cs.StorageV1().StorageClasses().Get(ctx, deferClass, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := sc.DeepCopy()
	bad.ObjectMeta = metav1.ObjectMeta{Name: "bad-" + ns}
	bad.MountOptions = []string{"bind"}
	if _, err := c.cs.StorageV1().StorageClasses().Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cs.StorageV1().StorageClasses().Delete(context.Background(), bad.Name, metav1.DeleteOptions{})
	})
	class := bad.Name
	if _, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.createPod(t, ns, podSpec("vm", microVMClass, nil, claimVolume("data", "bad")))
	msg := c.waitPodEvent(t, ns, "vm", "VolumeDeferralFailed", "(invalid argument)")
	if !strings.Contains(msg, "mount_flags") || !strings.Contains(msg, "bind") {
		t.Errorf("the failure event does not name the field and the option: %s", msg)
	}
	if out := c.kubectlOK(t, "-n", ns, "describe", "pod", "vm"); !strings.Contains(out, "VolumeDeferralFailed") {
		t.Errorf("kubectl describe pod does not show the failure:\n%s", out)
	}
	t.Logf("kubectl describe pod: %s", msg)
	if p, err := c.cs.CoreV1().Pods(ns).Get(ctx, "vm", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Fatalf("the pod runs without its volume: %v, %v", p.Status.Phase, err)
	}
	c.deletePod(t, ns, "vm")
}

// assertEmptyTarget checks that kubelet's target path is an empty directory with nothing mounted on it
// but the proxy's read-only guard: the volume is deferred to the sandbox.
func assertEmptyTarget(t *testing.T, c *cluster, target string) {
	t.Helper()
	entries, err := os.ReadDir(c.nsPath(target))
	if err != nil {
		t.Fatalf("target %s: %v", target, err)
	}
	if len(entries) != 0 {
		t.Errorf("target %s holds %d entries, want none", target, len(entries))
	}
	for _, m := range c.nsMountInfos(t, filepath.Dir(target)) {
		if m.Mountpoint == target && (m.FSType != "tmpfs" || m.Source != "crust-deferred" || !strings.Contains(","+m.Options+",", ",ro,")) {
			t.Errorf("%s %s (%s) is mounted on the deferred target %s, which only the proxy's read-only guard may be", m.FSType, m.Source, m.Options, target)
		}
	}
}

// driverNodePod is the example driver's node pod.
func (c *cluster) driverNodePod(t *testing.T) *corev1.Pod {
	t.Helper()
	pods, err := c.cs.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=crust-lvm-csi,app.kubernetes.io/component=node"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("%d driver node pods, want 1", len(pods.Items))
	}
	return &pods.Items[0]
}

// waitPodDirGone waits until kubelet has removed a deleted pod's directory (it does so a little after the
// pod object is gone), and checks nothing of the pod stays mounted on the host.
func (c *cluster) waitPodDirGone(t *testing.T, uid string) {
	t.Helper()
	dir := "/var/lib/kubelet/pods/" + uid
	waitFor(t, time.Minute, "kubelet to remove "+dir, func() (bool, error) {
		_, err := os.Lstat(c.nsPath(dir))
		return os.IsNotExist(err), err
	})
	if m := c.nsMounts(t, dir); len(m) != 0 {
		t.Errorf("mounts left for the deleted pod: %v", m)
	}
}

func near(a, b, tol int64) bool { return max(a-b, b-a) <= tol }
