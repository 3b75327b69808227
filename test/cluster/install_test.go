package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
	pod := c.runPod(t, ns, podSpec("vm", true, nil, claimVolume("data", c.pvc(t, ns, "data", "64Mi").Name)))
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
	if out, err := helm("install", "crust", chart, "-n", "crust-system", "--set", "image.repository="+repo, "--set", "image.tag="+tag,
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

// checkSecureMetrics checks crustd's authenticated /metrics at url (metrics.secure.enabled): no token is
// 401, the token of a service account without the permission 403, and one bound to the ClusterRole
// crust-metrics-reader reads crust_build_info.
func (c *cluster) checkSecureMetrics(t *testing.T, ns, url string) {
	t.Helper()
	ctx := ctxT(t)
	token := func(sa string) string {
		t.Helper()
		if _, err := c.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, nobody := token("scraper"), token("nobody")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "crust-metrics-reader-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "crust-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}}}
	if _, err := c.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	// crustd's certificate is self-signed: what a PodMonitor with insecureSkipVerify does.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	for _, tc := range []struct {
		who, token string
		code       int
	}{{"no token", "", http.StatusUnauthorized}, {"a service account without the permission", nobody, http.StatusForbidden},
		{"a service account bound to crust-metrics-reader", scraper, http.StatusOK}} {
		var body string
		// RBAC reaches the API server's authorizer a moment after the binding is made.
		waitFor(t, time.Minute, tc.who+" answered "+strconv.Itoa(tc.code), func() (bool, error) {
			code, b, err := get(tc.token)
			body = b
			return code == tc.code, fmt.Errorf("%d %v: %.200s", code, err, b)
		})
		t.Logf("GET %s with %s: %d", url, tc.who, tc.code)
		if tc.code == http.StatusOK && !strings.Contains(body, "crust_build_info{") {
			t.Errorf("%s read no crust_build_info:\n%.500s", tc.who, body)
		}
	}
}

// TestKubectlPlugin runs `kubectl crust` as an operator would, kubectl finding kubectl-crust on PATH.
func TestKubectlPlugin(t *testing.T) {
	c, _, ns := begin(t)
	pod := c.runPod(t, ns, podSpec("vm", true, nil, claimVolume("data", c.pvc(t, ns, "data", "64Mi").Name)))
	vols := c.podVolumes(t, string(pod.UID))
	if len(vols) != 1 {
		t.Fatalf("crustd holds %d descriptors of the pod, want 1", len(vols))
	}
	target := vols[0].GetSpec().GetVolumeTargetPath()
	plugin := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(c.kubectl, append([]string{"crust"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+c.binDir+":"+os.Getenv("PATH"), "KUBECONFIG="+c.kubeconfig)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("kubectl crust %s: %v", strings.Join(args, " "), err)
		}
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	// row reports whether out has a row of the node that names target.
	row := func(out string) bool {
		for s := bufio.NewScanner(strings.NewReader(out)); s.Scan(); {
			if f := strings.Fields(s.Text()); len(f) > 1 && f[0] == c.node && f[1] == target {
				return true
			}
		}
		return false
	}
	for _, args := range [][]string{{"ls"}, {"ls", "--node", c.node}, {"get", target}, {"get", target, "--node", c.node}} {
		out, errs, code := plugin(args...)
		t.Logf("kubectl crust %s:\n%s", strings.Join(args, " "), out)
		if code != 0 || !row(out) {
			t.Errorf("kubectl crust %s: exit %d, no row of node %s for %s:\n%s%s", strings.Join(args, " "), code, c.node, target, out, errs)
		}
	}

	out, errs, code := plugin("ls", "-o", "json")
	var doc struct {
		Items []struct {
			Node    string            `json:"node"`
			Volumes []json.RawMessage `json:"volumes"`
		} `json:"items"`
	}
	err := json.Unmarshal([]byte(out), &doc)
	if err != nil || code != 0 || len(doc.Items) != 1 || doc.Items[0].Node != c.node || !strings.Contains(out, `"volume_target_path": "`+target+`"`) {
		t.Errorf("kubectl crust ls -o json: exit %d, %v:\n%s%s", code, err, out, errs)
	}

	if out, errs, code := plugin("ls", "--node", "no-such-node"); code != 1 || !strings.Contains(errs, "no crustd pod on node no-such-node") {
		t.Errorf("kubectl crust ls --node no-such-node: exit %d:\n%s%s", code, out, errs)
	}
	if out, errs, code := plugin("get", "/var/lib/kubelet/pods/none/volumes/kubernetes.io~csi/none/mount"); code != 1 || !strings.Contains(errs, "NotFound: no crustd holds") {
		t.Errorf("kubectl crust get of an unknown target: exit %d:\n%s%s", code, out, errs)
	}
	// Other tests may leave problems for doctor to find (3); it must ask the node either way.
	if out, errs, code := plugin("doctor"); (code != 0 && code != 3) || !strings.HasPrefix(out, c.node+" ") {
		t.Errorf("kubectl crust doctor: exit %d:\n%s%s", code, out, errs)
	}
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
