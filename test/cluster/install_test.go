package cluster

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestInstallMethods moves crustd between the two ways an operator installs it, as deploy/helm/README.md
// tells them to, with a deferred volume staged throughout:
//   - installed by `kubectl apply -k` (cluster-up), then adopted by `helm install` of the chart: the
//     chart renders the same pod, so crustd is not restarted;
//   - `helm upgrade` with a value that changes the pod: the DaemonSet replaces it, and the new crustd
//     holds the descriptor;
//   - `helm uninstall`, then `kubectl apply -k` again: crustd's state on the node outlives its DaemonSet.
func TestInstallMethods(t *testing.T) {
	c, _, ns := begin(t)
	helm := c.helm(t)
	chart := filepath.Join(c.root, "deploy", "helm", "crust")
	repo, tag := c.image(t, "crust/crustd")
	pod := c.runPod(t, ns, podSpec("vm", microVMClass, nil, claimVolume("data", c.pvc(t, ns, "data", "64Mi").Name)))
	held := func(step string) {
		t.Helper()
		if got := c.podVolumes(t, string(pod.UID)); len(got) != 1 {
			t.Fatalf("%s: crustd holds %d descriptors of the pod, want 1", step, len(got))
		}
	}
	held("installed by kustomize")
	// However the test ends, crustd is left as cluster-up installed it, for the tests that follow.
	kustomize := func() {
		c.kubectlOK(t, "apply", "-k", filepath.Join(c.run, "deploy", "crust"))
		c.kubectlOK(t, "-n", "crust-system", "rollout", "status", "daemonset/crustd", "--timeout=2m")
	}
	t.Cleanup(func() {
		if t.Failed() {
			_, _ = helm("uninstall", "crust", "-n", "crust-system", "--wait")
			kustomize()
		}
	})

	before := c.crustdPod(t)
	c.kubectlOK(t, "-n", "crust-system", "annotate", "daemonset", "crustd", "meta.helm.sh/release-name=crust", "meta.helm.sh/release-namespace=crust-system")
	c.kubectlOK(t, "-n", "crust-system", "label", "daemonset", "crustd", "app.kubernetes.io/managed-by=Helm")
	// The node's default runtime is the microVM's (hack/cluster/lib.sh): crustd names runc, as deploy/ does here.
	if out, err := helm("install", "crust", chart, "-n", "crust-system", "--set", "image.repository="+repo, "--set", "image.tag="+tag,
		"--set", "runtimeClassName=runc",
		"--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	if after := c.crustdPod(t); after.UID != before.UID {
		t.Errorf("adopting crustd's DaemonSet into the chart restarted crustd (pod %s, now %s)", before.Name, after.Name)
	}
	held("adopted by helm install")

	if out, err := helm("upgrade", "crust", chart, "-n", "crust-system", "--reuse-values", "--set", "log.level=debug",
		"--set", "metrics.secure.enabled=true", "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	c.kubectlOK(t, "-n", "crust-system", "rollout", "status", "daemonset/crustd", "--timeout=2m")
	upgraded := c.crustdPod(t)
	if upgraded.UID == before.UID || !slices.Contains(upgraded.Spec.Containers[0].Args, "--log-level=debug") {
		t.Fatalf("helm upgrade --set log.level=debug: crustd's pod %s has args %q", upgraded.Name, upgraded.Spec.Containers[0].Args)
	}
	held("after helm upgrade")
	c.checkSecureMetrics(t, ns, "https://"+net.JoinHostPort(upgraded.Status.HostIP, "9443")+"/metrics")

	if out, err := helm("uninstall", "crust", "-n", "crust-system", "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	waitFor(t, 2*time.Minute, "crustd's pods gone after helm uninstall", func() (bool, error) {
		pods, err := c.crustdPods()
		return err == nil && len(pods) == 0, err
	})
	kustomize()
	if ds := c.kubectlOK(t, "-n", "crust-system", "get", "daemonset", "crustd", "-o", "jsonpath={.metadata.labels}"); strings.Contains(ds, "Helm") {
		t.Errorf("the DaemonSet kustomize made again carries Helm's labels: %s", ds)
	}
	held("uninstalled and installed by kustomize again")
}

// helm returns a runner of Helm (the version deploy/helm pins, built from its module) against the
// cluster, with Helm's own files in a temporary directory.
func (c *cluster) helm(t *testing.T) func(args ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "helm")
	build := exec.Command("go", "build", "-o", bin, "helm.sh/helm/v3/cmd/helm")
	build.Dir, build.Env = filepath.Join(c.root, "deploy", "helm"), append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building helm: %v\n%s", err, out)
	}
	return func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir+"/cache", "HELM_CONFIG_HOME="+dir+"/config", "HELM_DATA_HOME="+dir+"/data")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}

// image returns the repository and tag under which the cluster runs the image named name in deploy/.
func (c *cluster) image(t *testing.T, name string) (repo, tag string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.root, "_output", "images", "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			if r, tg, ok := strings.Cut(f[1], ":"); ok && strings.HasSuffix(r, "/"+name) {
				return r, tg
			}
		}
	}
	t.Fatalf("no image %s in images.txt:\n%s", name, b)
	return "", ""
}

// crustdPod returns crustd's running pod.
func (c *cluster) crustdPod(t *testing.T) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, 2*time.Minute, "one running crustd pod", func() (bool, error) {
		pod = nil
		pods, err := c.crustdPods()
		if err != nil {
			return false, err
		}
		var names []string
		for i, p := range pods {
			names = append(names, p.Name+" ("+string(p.Status.Phase)+")")
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				pod = &pods[i]
			}
		}
		return len(pods) == 1 && pod != nil, errors.New("crustd's pods: " + strings.Join(names, ", "))
	})
	return pod
}

// crustdPods lists crustd's pods, whatever their phase.
func (c *cluster) crustdPods() ([]corev1.Pod, error) {
	pods, err := c.cs.CoreV1().Pods("crust-system").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=crustd"})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}
