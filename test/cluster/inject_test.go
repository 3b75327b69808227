package cluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The example driver in two shapes, each deployed as its project would deploy it and given
// crust-csi-proxy by `kubectl crust inject` alone (hack/cluster/up.sh): a node DaemonSet and a controller
// Deployment with a socket not named csi.sock, the node plugin under a ServiceAccount of its own
// (deploy/examples); and one StatefulSet pod holding the driver, the registrar, the provisioner and the
// resizer, as csi-driver-host-path deploys itself (deploy/examples/lvm-statefulset). Both run on the host
// network here, the one change up.sh makes before the injection (it says why). For each, a deferred volume
// of a microVM pod reaches crustd through the injected proxies: the controller proxy put crust.dev/defer
// into the PersistentVolume, and the node proxy, which kubelet dialled, deposited the descriptor with
// crustd and left the target empty; and each proxy serves its metrics where the injection said, to a
// scraper on the node.
func TestInjectedShapes(t *testing.T) {
	c, ctx, ns := begin(t)
	for i, shape := range []struct {
		name, class, driver, selector, account string
	}{
		{"DaemonSet and Deployment", deferClass, driverName, "app.kubernetes.io/name=crust-lvm-csi,app.kubernetes.io/component=node", "crust-lvm-csi-node"},
		{"one StatefulSet pod", "crust-lvm-sts-defer", "lvm-sts.test.crust.dev", "app.kubernetes.io/name=crust-lvm-sts", "crust-lvm-sts"},
	} {
		t.Run(shape.name, func(t *testing.T) {
			// The driver's node pod runs the injected proxy, under the driver's own account.
			pods, err := c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: shape.selector + ",crust.dev/csi-proxy=injected"})
			if err != nil || len(pods.Items) != 1 {
				t.Fatalf("the driver's injected node pod (%s): %v, %v", shape.selector, len(pods.Items), err)
			}
			node := pods.Items[0]
			if node.Spec.ServiceAccountName != shape.account || !slices.ContainsFunc(node.Spec.Containers, func(c corev1.Container) bool { return c.Name == "crust-csi-proxy" }) {
				t.Fatalf("pod %s: account %q, containers %v; want %q and crust-csi-proxy", node.Name, node.Spec.ServiceAccountName, node.Spec.Containers, shape.account)
			}

			claim := c.pvcOfClass(t, ns, fmt.Sprintf("data-%d", i), "64Mi", shape.class, nil)
			pod := c.runPod(t, ns, podSpec(fmt.Sprintf("vm-%d", i), microVMClass, nil, claimVolume("data", claim.Name)))
			p, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pv, err := c.cs.CoreV1().PersistentVolumes().Get(ctx, p.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != shape.driver || pv.Spec.CSI.VolumeAttributes["crust.dev/defer"] != "true" {
				t.Fatalf("PV %s: %v; want driver %s with crust.dev/defer from the controller proxy", pv.Name, pv.Spec.CSI, shape.driver)
			}
			vols := c.podVolumes(t, string(pod.UID))
			if len(vols) != 1 {
				t.Fatalf("crustd holds %d descriptors for pod %s, want 1", len(vols), pod.UID)
			}
			if spec := vols[0].GetSpec(); spec.GetCsiDriver() != shape.driver || !spec.GetCreateFilesystem() {
				t.Errorf("descriptor: driver %q, create_filesystem %v; want %s, true", spec.GetCsiDriver(), spec.GetCreateFilesystem(), shape.driver)
			}
			assertEmptyTarget(t, c, vols[0].GetSpec().GetVolumeTargetPath())

			// Each proxy of the shape's pods answers /metrics at its --http-addr (the node's loopback, on
			// the host network).
			all, err := c.cs.CoreV1().Pods(node.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "crust.dev/csi-proxy=injected"})
			if err != nil {
				t.Fatal(err)
			}
			proxies := 0
			for _, p := range all.Items {
				for _, ctr := range p.Spec.Containers {
					if !strings.HasPrefix(ctr.Name, "crust-csi-proxy") {
						continue
					}
					addr := ""
					for _, a := range ctr.Args {
						addr = strings.TrimPrefix(a, "--http-addr=")
						if addr != a {
							break
						}
						addr = ""
					}
					if !strings.HasPrefix(addr, "127.0.0.1:") {
						t.Fatalf("pod %s, container %s on the host network: --http-addr %q, want the node's loopback", p.Name, ctr.Name, addr)
					}
					if body := c.scrape(t, &p, "http://"+addr+"/metrics", false, ""); !strings.Contains(body, "crust_build_info{") {
						t.Errorf("%s of %s/%s: no crust_build_info", addr, p.Name, ctr.Name)
					}
					proxies++
				}
			}
			if proxies != 2 {
				t.Errorf("%d proxies answered in namespace %s, want a node's and a controller's", proxies, node.Namespace)
			}
		})
	}
}
