package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// counterScript keeps a counter on the volume at /data, as an application that must not lose an
// acknowledged write does: write, fsync, rename, fsync, twice a second.
const counterScript = `trap 'exit 0' TERM
i=$(cat /data/n 2>/dev/null || echo 0)
while true; do i=$((i+1)); echo $i > /data/n.tmp; sync /data/n.tmp; mv /data/n.tmp /data/n; sync /data; sleep 0.5; done`

// counterPod is podSpec whose container keeps counterScript's counter on the PVC claim at /data.
func counterPod(name, runtimeClass, claim string) *corev1.Pod {
	p := podSpec(name, runtimeClass, nil, claimVolume("data", claim))
	p.Spec.Containers[0].Command = []string{"sh", "-c", counterScript}
	return p
}

// counter reads the counter of a running pod's volume.
func (c *cluster) counter(t *testing.T, ns, pod string) int {
	t.Helper()
	out := c.kubectlOK(t, "-n", ns, "exec", pod, "--", "cat", "/data/n")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("the counter of pod %s: %q: %v", pod, out, err)
	}
	return n
}

// TestOneWriterOnTheNode: one ReadWriteOnce PVC of the deferring class, and pods of both runtimes on the
// node. While microVM pod vm writes its counter, a runc pod and a second microVM pod naming the PVC are
// refused with a FailedMount Event that names pod vm (and the proxy's VolumeHeldByAnotherPod before it),
// and vm's counter goes on; once vm is gone a runc pod runs and reads vm's last count (nothing
// acknowledged was lost); a microVM pod is then refused naming the runc pod and the node, while a second
// runc pod shares the volume (one kernel). After every pod is gone, e2fsck -fn finds the filesystem clean.
//
// kubelet serialises the mounts of one CSI volume that is staged, whichever pod asks, and backs off after
// each failure (to two minutes), so a refused pod is deleted as soon as its Event is seen: the next pod's
// mount then waits seconds, not minutes.
func TestOneWriterOnTheNode(t *testing.T) {
	c, ctx, ns := begin(t)
	c.pvc(t, ns, "data", "64Mi")
	vm := c.runPod(t, ns, counterPod("vm", microVMClass, "data"))
	vols := c.podVolumes(t, string(vm.UID))
	if len(vols) != 1 {
		t.Fatalf("descriptors of pod vm: %v", vols)
	}
	device := c.nsPath(vols[0].GetSpec().GetVolumeBackingPath())
	first := c.counter(t, ns, "vm")

	refused := func(pod, runtimeClass, holder string) {
		t.Helper()
		c.createPod(t, ns, counterPod(pod, runtimeClass, "data"))
		t.Logf("pod %s: %s", pod, c.waitPodEvent(t, ns, pod, "FailedMount", holder))
		c.waitPodEvent(t, ns, pod, "VolumeHeldByAnotherPod", holder)
		if got, err := c.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{}); err != nil || got.Status.Phase == corev1.PodRunning {
			t.Fatalf("pod %s runs beside the holder: %v", pod, err)
		}
		c.deletePod(t, ns, pod)
	}
	refused("runc", runcClass, "pod "+ns+"/vm")
	refused("vm2", microVMClass, "pod "+ns+"/vm")
	last := c.counter(t, ns, "vm")
	if last <= first {
		t.Fatalf("pod vm's counter stood at %d while the others were refused (was %d)", last, first)
	}
	c.deletePod(t, ns, "vm")
	c.runPod(t, ns, counterPod("runc", runcClass, "data"))
	if n := c.counter(t, ns, "runc"); n < last {
		t.Fatalf("the runc pod counts from %d; pod vm had acknowledged %d", n, last)
	}

	refused("vm3", microVMClass, "pod "+ns+"/runc")
	c.runPod(t, ns, counterPod("runc2", runcClass, "data")) // two runc pods share one kernel's mount
	for _, p := range []string{"runc", "runc2"} {
		c.deletePod(t, ns, p)
	}
	waitFor(t, 2*time.Minute, "the volume unmounted from the node", func() (bool, error) {
		return !c.mountedOnNode(t, device), nil
	})
	if out, err := exec.Command("e2fsck", "-fn", device).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn %s after the pods: %v\n%s", device, err, out)
	}
}

// mountedOnNode reports whether the node has device (a path on this host) mounted under its kubelet
// directory, where the proxy and kubelet mount volumes.
func (c *cluster) mountedOnNode(t *testing.T, device string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(device, &st); err != nil {
		t.Fatal(err)
	}
	for _, m := range c.nsMountInfos(t, "/var/lib/kubelet") {
		if uint32(m.Major) == unix.Major(st.Rdev) && uint32(m.Minor) == unix.Minor(st.Rdev) { //nolint:gosec // device numbers are small
			return true
		}
	}
	return false
}

// TestOneWriterRollouts: a Deployment of one microVM pod on a ReadWriteOnce PVC, rolled out with the
// default strategy (RollingUpdate), starts the new pod while the old one holds the volume: the new pod
// gets a FailedMount Event that names the old pod and the remedy (kubelet's FailedMount, and the proxy's VolumeHeldByAnotherPod before it), and no
// Event blames its runtime. With
// the Recreate strategy the rollout completes and the new pod counts on from the old one's count. A
// StatefulSet's pod deleted and recreated finds its data.
func TestOneWriterRollouts(t *testing.T) {
	c, ctx, ns := begin(t)
	c.pvc(t, ns, "data", "64Mi")
	labels := map[string]string{"app": "counter"}
	tmpl := counterPod("app", microVMClass, "data")
	dep, err := c.cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: tmpl.Spec}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := c.onlyPod(t, ns, "app=counter", "")
	c.waitRunning(t, ns, old)
	before := c.counter(t, ns, old)

	patch := func(p string) {
		t.Helper()
		if _, err := c.cs.AppsV1().Deployments(ns).Patch(ctx, dep.Name, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(`{"spec":{"template":{"metadata":{"annotations":{"rev":"2"}}}}}`)
	next := c.onlyPod(t, ns, "app=counter", old)
	msg := c.waitPodEvent(t, ns, next, "VolumeHeldByAnotherPod", "pod "+ns+"/"+old)
	c.waitPodEvent(t, ns, next, "FailedMount", "pod "+ns+"/"+old)
	for _, w := range []string{"Recreate", "ReadWriteOncePod"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the refused pod's Event does not name the remedy %s: %s", w, msg)
		}
	}
	if ev := c.events(ns, next); strings.Contains(ev, "VolumeNotConsumed") || strings.Contains(ev, "DeferralFailed") {
		t.Errorf("the refused pod has an Event that blames its runtime:\n%s", ev)
	}
	t.Logf("rolling update refused: %s", msg)

	patch(`{"spec":{"strategy":{"type":"Recreate","rollingUpdate":null}}}`)
	waitFor(t, 4*time.Minute, "the Recreate rollout complete", func() (bool, error) {
		d, err := c.cs.AppsV1().Deployments(ns).Get(ctx, dep.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := d.Status
		return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == 1 && s.AvailableReplicas == 1 && s.Replicas == 1,
			fmt.Errorf("status %+v; events of %s: %s", s, next, c.events(ns, next))
	})
	if n := c.counter(t, ns, c.onlyPod(t, ns, "app=counter", old)); n < before {
		t.Fatalf("the new pod counts from %d; the old one had %d", n, before)
	}
	if err := c.cs.AppsV1().Deployments(ns).Delete(ctx, dep.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A StatefulSet's pod, deleted, comes back to its data.
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}},
				Spec: counterPod("db", microVMClass, "data").Spec},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{*claimOf("data", "64Mi", deferClass, nil)},
		},
	}
	sts.Spec.Template.Spec.Volumes = nil
	if _, err := c.cs.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitRunning(t, ns, "db-0")
	first, err := c.cs.CoreV1().Pods(ns).Get(ctx, "db-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	count := c.counter(t, ns, "db-0")
	if err := c.cs.CoreV1().Pods(ns).Delete(ctx, "db-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 4*time.Minute, "db-0 recreated and running", func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(ns).Get(ctx, "db-0", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.UID != first.UID && p.Status.Phase == corev1.PodRunning, fmt.Errorf("uid %s, phase %s", p.UID, p.Status.Phase)
	})
	if n := c.counter(t, ns, "db-0"); n < count {
		t.Fatalf("the recreated db-0 counts from %d; it had %d", n, count)
	}
	if err := c.cs.AppsV1().StatefulSets(ns).Delete(ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// onlyPod waits until exactly one pod with selector, other than not, exists in ns and not being deleted,
// and returns its name.
func (c *cluster) onlyPod(t *testing.T, ns, selector, not string) string {
	t.Helper()
	var name string
	waitFor(t, 2*time.Minute, "one pod "+selector, func() (bool, error) {
		l, err := c.cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		var names []string
		for _, p := range l.Items {
			if p.Name != not && p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		if len(names) != 1 {
			return false, fmt.Errorf("pods %v", names)
		}
		name = names[0]
		return true, nil
	})
	return name
}
