package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A pod of a microVM class whose runtime does not consume crust (the kata RuntimeClass, runc standing
// in) gets its deferred volume's target as it is. Without a subPath the proxy has guarded the target: the
// container's writes fail (a read-only filesystem) instead of landing on the node's disk, and the proxy
// tells the pod, in a VolumeNotConsumed Event, that nothing claimed the volume while it ran. With a
// subPath (no guard: kubelet makes the subPath's directory in the target) the container's writes do land
// on the node; when the pod is deleted, the proxy moves them into the quarantine, names it in a
// VolumeDataQuarantined Event, and the pod terminates with nothing lost.
func TestUnconsumedDeferredVolume(t *testing.T) {
	c, ctx, ns := begin(t)
	c.pvc(t, ns, "guarded", "64Mi")
	c.pvc(t, ns, "written", "64Mi")

	guarded := c.runPod(t, ns, podSpec("guarded", kataClass, nil, claimVolume("data", "guarded")))
	if out, err := c.shell(t, ns, "guarded", "c").Exec("touch", "/data/x"); err == nil || !strings.Contains(err.Error(), "Read-only file system") {
		t.Errorf("a write to the unclaimed deferred volume: %v (%q), want it refused as a read-only file system", err, out)
	}
	waitFor(t, 5*time.Minute, "the proxy's VolumeNotConsumed Event on the pod", func() (bool, error) {
		_, ok, err := c.podEvent(ctx, ns, string(guarded.UID), "VolumeNotConsumed")
		return ok, err
	})

	p := podSpec("written", kataClass, nil, claimVolume("data", "written"))
	p.Spec.Containers[0].VolumeMounts[0].SubPath = "sub"
	written := c.runPod(t, ns, p)
	c.shell(t, ns, "written", "c").ExecOK("sh", "-c", "echo kept > /data/file")
	c.deletePod(t, ns, "written") // the pod terminates: the unpublish is not refused
	var moved string
	waitFor(t, time.Minute, "the proxy's VolumeDataQuarantined Event", func() (ok bool, err error) {
		moved, ok, err = c.podEvent(ctx, ns, string(written.UID), "VolumeDataQuarantined")
		return ok, err
	})
	dir := filepath.Join("/var/lib/kubelet/crust-quarantine", string(written.UID))
	entries, err := os.ReadDir(c.nsPath(dir))
	if err != nil || len(entries) != 1 || !strings.Contains(moved, filepath.Join(dir, entries[0].Name())) {
		t.Fatalf("quarantine %s: %v (%v), Event %q", dir, entries, err, moved)
	}
	b, err := os.ReadFile(c.nsPath(filepath.Join(dir, entries[0].Name(), "sub", "file")))
	if err != nil || string(b) != "kept\n" {
		t.Errorf("the pod's file in the quarantine: %q, %v", b, err)
	}
	c.inNode(t, "rm", "-rf", "--one-file-system", dir)
}

// podEvent answers the message of an Event of reason on the pod of uid, and whether there is one.
func (c *cluster) podEvent(ctx context.Context, ns, uid, reason string) (string, bool, error) {
	ev, err := c.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + uid + ",reason=" + reason})
	if err != nil || len(ev.Items) == 0 {
		return "", false, err
	}
	return ev.Items[0].Message, true, nil
}
