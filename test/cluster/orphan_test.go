package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
)

// A microVM pod's deferred volume outlives its pod's kubelet directory the way it does on real nodes:
// kubelet is down (a node in trouble, a kubelet upgrade), the pod is force-deleted from the API, and the
// operator cleans the pod's directory by hand (unmounting what is mounted under it and removing it, the
// usual cure for "orphaned pod found, but volume paths are still present on disk"), then starts kubelet
// again. No NodeUnpublishVolume ever reaches the node plugin, so crustd still holds the descriptor.
// crustd's collector must notice the pod directory gone and unstage it: the descriptor disappears, with
// its log line and crust_garbage_collected_volumes_total counting it, while a live pod's descriptor on
// the same node stays. The node plugin then finishes what kubelet never asked (unpublish, unstage) with
// the descriptor already gone, and the PVC is deleted as usual. The pods are of the kata RuntimeClass
// (runc standing in), whose runtime holds no claim: what is collected is a descriptor nothing uses.
func TestOrphanCollector(t *testing.T) {
	c, ctx, ns := begin(t)
	c.pvc(t, ns, "data", "64Mi")
	c.pvc(t, ns, "kept", "64Mi")
	pod := c.runPod(t, ns, podSpec("vm", kataClass, nil, claimVolume("data", "data")))
	live := c.runPod(t, ns, podSpec("live", kataClass, nil, claimVolume("kept", "kept")))
	uid := string(pod.UID)
	vols := c.socketPodVolumes(t, uid)
	if len(vols) != 1 {
		t.Fatalf("crustd holds %d descriptors for pod %s, want 1", len(vols), uid)
	}
	target, volID := vols[0].GetSpec().GetVolumeTargetPath(), vols[0].GetSpec().GetVolumeId()
	if len(c.socketPodVolumes(t, string(live.UID))) != 1 {
		t.Fatalf("no descriptor for the live pod %s", live.UID)
	}
	collectedBefore := crustdMetric(t, "crust_garbage_collected_volumes_total")

	// kubelet down; the pod force-deleted; its directory cleaned by hand.
	startKubelet := c.stopKubelet(t)
	grace := int64(0)
	if err := c.cs.CoreV1().Pods(ns).Delete(ctx, "vm", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the force-deleted pod gone from the API", func() (bool, error) {
		_, err := c.cs.CoreV1().Pods(ns).Get(ctx, "vm", metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	podDir := "/var/lib/kubelet/pods/" + uid
	mounts := c.nsMounts(t, podDir)
	for i := len(mounts) - 1; i >= 0; i-- {
		c.inNode(t, "umount", mounts[i])
	}
	t.Logf("operator: unmounted %v, removing %s", mounts, podDir)
	if got := c.socketPodVolumes(t, uid); len(got) != 1 {
		t.Fatalf("before the pod directory went, crustd holds %d descriptors for the pod, want 1", len(got))
	}
	c.inNode(t, "rm", "-rf", "--one-file-system", podDir)
	removed := time.Now()
	startKubelet()

	// The collector unstages the orphan, and only it: as the pod directory goes (crustd watches kubelet's
	// pods directory), or at the latest at its --gc-interval (a minute by default).
	waitFor(t, 3*time.Minute, "crustd to collect the descriptor of the deleted pod", func() (bool, error) {
		return len(c.socketPodVolumes(t, uid)) == 0, nil
	})
	t.Logf("descriptor collected %s after the pod directory was removed", time.Since(removed).Round(100*time.Millisecond))
	if len(c.socketPodVolumes(t, string(live.UID))) != 1 {
		t.Errorf("the live pod's descriptor was collected too")
	}
	line := c.crustdLogLine(t, "garbage-collected the volume of a deleted pod", target)
	t.Logf("crustd: %s", line)
	if !strings.Contains(line, uid) {
		t.Errorf("the log line does not name the pod %s: %s", uid, line)
	}
	if after := crustdMetric(t, "crust_garbage_collected_volumes_total"); after < collectedBefore+1 {
		t.Errorf("crust_garbage_collected_volumes_total %v, was %v: the collection is not counted", after, collectedBefore)
	} else {
		t.Logf("crust_garbage_collected_volumes_total %v (was %v)", after, collectedBefore)
	}

	// The node plugin finishes what kubelet never asked, as an operator would through it: the proxy
	// finds the descriptor gone (not an error), the driver unpublishes and unstages. Then the PVC goes.
	node := c.nodePlugin(t)
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume of the collected volume: %v", err)
	}
	staging := c.stagingPath(t, volID)
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if err := c.cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the collected volume's PV deleted", func() (bool, error) {
		pvs, err := c.cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.CSI != nil && pv.Spec.CSI.VolumeHandle == volID {
				return false, fmt.Errorf("PV %s is %s", pv.Name, pv.Status.Phase)
			}
		}
		return true, nil
	})
	c.waitRunning(t, ns, "live")
	c.deletePod(t, ns, "live")
	c.waitPodDirGone(t, string(live.UID))
}

// stopKubelet stops the node's kubelet and returns what starts it again, with hack/cluster/lib.sh's
// start as hack/cluster/up.sh started it (same command line, same log, recorded as kubelet); the start
// waits until the node is Ready, and happens at cleanup if the test did not get there.
func (c *cluster) stopKubelet(t *testing.T) (start func()) {
	t.Helper()
	pid, err := c.recordedPID("kubelet")
	if err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if filepath.Base(argv[0]) != "kubelet" {
		t.Fatalf("pid %d, recorded as kubelet, is %v", pid, argv)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "kubelet to stop", func() (bool, error) {
		return syscall.Kill(pid, 0) == syscall.ESRCH, nil
	})
	started := false
	start = func() {
		t.Helper()
		if started {
			return
		}
		started = true
		if out, err := c.lib([]string{"RUN=" + c.run}, `start kubelet "$@"`, argv...); err != nil {
			t.Fatalf("starting kubelet again: %v\n%s", err, out)
		}
		t0 := time.Now()
		port := os.Getenv("KUBELET_HEALTHZ_PORT")
		if port == "" {
			port = "10248"
		}
		hc := &http.Client{Timeout: 2 * time.Second}
		waitFor(t, 2*time.Minute, "kubelet's /healthz", func() (bool, error) {
			resp, err := hc.Get("http://127.0.0.1:" + port + "/healthz")
			if err != nil {
				return false, err
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK, fmt.Errorf("%s", resp.Status)
		})
		c.kubectlOK(t, "wait", "--for=condition=Ready", "node/"+c.node, "--timeout=2m")
		t.Logf("kubelet started again, healthy and the node Ready after %s", time.Since(t0).Round(100*time.Millisecond))
	}
	t.Cleanup(start)
	return start
}

// inNode runs a command in the node's mount namespace, failing t on error.
func (c *cluster) inNode(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(c.nsPID), "-m", "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// crustdMetric reads one metric without labels from crustd's /metrics (127.0.0.1:9809, deploy/'s
// --http-addr on the host network); 0 when crustd has not exported it yet.
func crustdMetric(t *testing.T, name string) float64 {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://127.0.0.1:9809/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return f
		}
	}
	t.Fatalf("crustd's /metrics has no %s", name)
	return 0
}

// crustdLogLine returns the line of crustd's log (JSON) whose message is msg and that mentions what.
func (c *cluster) crustdLogLine(t *testing.T, msg, what string) string {
	t.Helper()
	// A kubelet started moments ago answers NotFound for the logs of a pod it has not synced yet.
	var out string
	waitFor(t, 2*time.Minute, "crustd's log from kubelet", func() (bool, error) {
		var err error
		out, err = c.kubectlRun("-n", "crust-system", "logs", "daemonset/crustd", "--tail=-1")
		return err == nil, err
	})
	for _, l := range strings.Split(out, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == msg && strings.Contains(l, what) {
			return l
		}
	}
	t.Fatalf("crustd logged no %q for %s", msg, what)
	return ""
}

// socketPodVolumes is podVolumes through crustd's socket in the node's mount namespace: crustctl in
// crustd's pod needs kubelet for exec, and kubelet is down for part of the test.
func (c *cluster) socketPodVolumes(t *testing.T, uid string) []*crustv1.Volume {
	t.Helper()
	cc, err := crustd.Dial(c.nsPath("/run/crust/crust.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	var vs []*crustv1.Volume
	req := &crustv1.ListVolumesRequest{}
	for {
		resp, err := crustv1.NewVolumeServiceClient(cc).ListVolumes(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range resp.GetVolumes() {
			if v.GetSpec().GetPodUid() == uid {
				vs = append(vs, v)
			}
		}
		if req.StartingToken = resp.GetNextToken(); req.StartingToken == "" {
			return vs
		}
	}
}

// nodePlugin is a CSI Node client of the node plugin on the socket kubelet dials: the one `kubectl crust
// inject` gave crust-csi-proxy, beside the driver's.
func (c *cluster) nodePlugin(t *testing.T) csi.NodeClient {
	t.Helper()
	cc, err := crustd.Dial(c.nsPath("/var/lib/kubelet/plugins/" + driverName + "/crust-node.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return csi.NewNodeClient(cc)
}

// stagingPath is kubelet's staging path of a volume of the example driver: the globalmount beside the
// vol_data.json that names the volume handle.
func (c *cluster) stagingPath(t *testing.T, volID string) string {
	t.Helper()
	dir := "/var/lib/kubelet/plugins/kubernetes.io/csi/" + driverName
	entries, err := os.ReadDir(c.nsPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(c.nsPath(filepath.Join(dir, e.Name(), "vol_data.json")))
		if err != nil {
			continue
		}
		var d struct {
			VolumeHandle string `json:"volumeHandle"`
		}
		if json.Unmarshal(b, &d) == nil && d.VolumeHandle == volID {
			return filepath.Join(dir, e.Name(), "globalmount")
		}
	}
	t.Fatalf("no staging path of volume %s under %s", volID, dir)
	return ""
}
