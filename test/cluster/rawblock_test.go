package cluster

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A raw block PVC (volumeMode: Block) of the deferring class, used by a pod of the microVM RuntimeClass
// through volumeDevices, with the example driver behind crust-csi-proxy:
//   - the pod runs and its container has the device at the devicePath: a pattern written through it with
//     direct I/O reads back the same, and the node reads it from the device the driver published;
//   - crustd holds no descriptor for the pod (the volume was never deferred) and no VolumeDeferred event
//     was recorded;
//   - the proxy logged its decision for the pod's publish: pass-through, volume mode block, and why.
func TestRawBlockVolumeOfMicroVMPod(t *testing.T) {
	c := get(t)
	ns := c.namespace(t)
	block := corev1.PersistentVolumeBlock
	c.pvcOfMode(t, ns, "raw", "64Mi", &block)
	const devicePath = "/dev/xvda"
	p := podSpec("vm", microVMClass, nil)
	p.Spec.Volumes = []corev1.Volume{claimVolume("raw", "raw")}
	p.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "raw", DevicePath: devicePath}}
	t0 := time.Now()
	pod := c.runPod(t, ns, p)
	uid := string(pod.UID)
	t.Logf("microVM pod with a raw block PVC Running %s after the PVC was created", time.Since(t0).Round(100*time.Millisecond))
	if _, handler := c.sandboxOf(t, uid); handler != microVMClass {
		t.Fatalf("the pod's sandbox runs with handler %q, want %q", handler, microVMClass)
	}

	// The container has the device: a pattern written through it reads back, both with direct I/O.
	out := c.kubectlOK(t, "-n", ns, "exec", "vm", "--", "sh", "-c", fmt.Sprintf(
		"stat -c %%F %[1]s && dd if=/dev/urandom of=/tmp/p bs=4096 count=64 2>/dev/null && "+
			"dd if=/tmp/p of=%[1]s bs=4096 seek=10 oflag=direct conv=fsync 2>/dev/null && md5sum /tmp/p && "+
			"dd if=%[1]s bs=4096 skip=10 count=64 iflag=direct 2>/dev/null | md5sum && blockdev --getsize64 %[1]s", devicePath))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || lines[0] != "block special file" {
		t.Fatalf("in the container: %q; want a block device node, two checksums and a size", out)
	}
	written, read := strings.Fields(lines[1])[0], strings.Fields(lines[2])[0]
	if written != read {
		t.Fatalf("wrote %s through %s, read back %s", written, devicePath, read)
	}
	if lines[3] != fmt.Sprint(64<<20) {
		t.Errorf("the device holds %s bytes, want %d", lines[3], 64<<20)
	}
	t.Logf("pattern of 256 KiB written through %s and read back in the container (md5 %s)", devicePath, read)
	// And it is on the device the driver published for the pod, read on the node.
	claim, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctxT(t), "raw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	published := "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/" + claim.Spec.VolumeName + "/" + uid
	onNode, err := exec.Command("sh", "-c", fmt.Sprintf("dd if=%s bs=4096 skip=10 count=64 iflag=direct 2>/dev/null | md5sum",
		c.nsPath(published))).Output()
	if err != nil || strings.Fields(string(onNode))[0] != written {
		t.Fatalf("the node reads %q (%v) from %s, the container wrote %s", onNode, err, published, written)
	}

	// Never deferred: crustd holds nothing for the pod, and the proxy says why.
	if vs := c.podVolumes(t, uid); len(vs) != 0 {
		t.Fatalf("crustd holds %d descriptors for the pod of a raw block volume: %v", len(vs), vs)
	}
	if ev := c.events(ns, "vm"); strings.Contains(ev, "VolumeDeferred") || strings.Contains(ev, "VolumeMountedOnHost") {
		t.Errorf("the raw block volume was acted on by the proxy:\n%s", ev)
	}
	node := c.driverNodePod(t)
	var decision string
	waitFor(t, 30*time.Second, "the proxy's decision in its log", func() (bool, error) {
		logs, err := c.kubectlRun("-n", node.Namespace, "logs", node.Name, "-c", "crust-csi-proxy", "--tail=-1")
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "publish decision") && strings.Contains(l, uid) {
				decision = l
				return true, nil
			}
		}
		return false, err
	})
	for _, want := range []string{"pass-through", "block", "never deferred"} {
		if !strings.Contains(decision, want) {
			t.Errorf("the proxy's decision lacks %q: %s", want, decision)
		}
	}
	t.Logf("proxy: %s", decision)
}
