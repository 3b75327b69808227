package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// podMonitor is what a scrape of one of deploy/monitoring's PodMonitors takes from it, as the Prometheus
// Operator turns it into Prometheus's scrape configuration.
type podMonitor struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		NamespaceSelector struct {
			Any bool `json:"any"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port      string `json:"port"`
			Path      string `json:"path"`
			Scheme    string `json:"scheme"`
			TLSConfig *struct {
				InsecureSkipVerify bool `json:"insecureSkipVerify"`
			} `json:"tlsConfig"`
			Authorization *struct {
				Credentials struct{ Name, Key string } `json:"credentials"`
			} `json:"authorization"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// TestPodMonitorTargetsUp scrapes every target deploy/monitoring's crustd PodMonitor selects on the
// cluster, as Prometheus would (the pod's IP, the named port, the path, scheme and credentials the monitor
// gives), once deploy/metrics-auth and the scraper's account (deploy/monitoring/scraper.yaml) are applied
// as deploy/monitoring/README.md says, with the token Kubernetes put in the scraper's Secret; each must
// answer with crustd's metrics. The cluster runs no Prometheus Operator, so the PodMonitor is read from
// its file, not applied.
//
// The proxy's PodMonitor is not scraped here: its targets are the pod IPs of drivers off the host network,
// and on this cluster the drivers run on it (hack/cluster/up.sh says why), where the proxy keeps its
// endpoint to the node's loopback; TestInjectedShapes scrapes that.
func TestPodMonitorTargetsUp(t *testing.T) {
	c, ctx, _ := begin(t)
	crustd := c.readPodMonitor(t, "podmonitor.yaml")

	t.Run("crustd", func(t *testing.T) {
		dir := t.TempDir()
		rel, err := filepath.Rel(dir, filepath.Join(c.run, "deploy", "crust"))
		if err != nil {
			t.Fatal(err)
		}
		relAuth, err := filepath.Rel(dir, filepath.Join(c.root, "deploy", "metrics-auth"))
		if err != nil {
			t.Fatal(err)
		}
		kust := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\n", rel, relAuth)
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
			t.Fatal(err)
		}
		scraper := filepath.Join(c.root, "deploy", "monitoring", "scraper.yaml")
		// deploy/ as cluster-up applied it, then without what the test added. apply alone would leave the
		// ServiceAccount: the API server copies serviceAccountName into the deprecated serviceAccount,
		// from which it comes back unless one patch removes both.
		t.Cleanup(func() {
			_, _ = c.kubectlRun("-n", "crust-system", "patch", "daemonset", "crustd", "--type=json", "-p",
				`[{"op": "remove", "path": "/spec/template/spec/serviceAccountName"}, {"op": "remove", "path": "/spec/template/spec/serviceAccount"}]`)
			c.kubectlOK(t, "apply", "-k", filepath.Join(c.run, "deploy", "crust"))
			c.kubectlOK(t, "-n", "crust-system", "rollout", "status", "daemonset/crustd", "--timeout=2m")
			_, _ = c.kubectlRun("delete", "--ignore-not-found", "-f", scraper)
			_, _ = c.kubectlRun("delete", "--ignore-not-found", "-f", filepath.Join(c.root, "deploy", "metrics-auth", "rbac.yaml"))
			if sa := c.crustdPod(t).Spec.ServiceAccountName; sa != "default" && sa != "" {
				t.Errorf("crustd runs as %q after the test, want deploy/'s default account", sa)
			}
		})
		c.kubectlOK(t, "apply", "-k", dir)
		c.kubectlOK(t, "apply", "-f", scraper)
		c.kubectlOK(t, "-n", "crust-system", "rollout", "status", "daemonset/crustd", "--timeout=2m")
		ep := crustd.Spec.Endpoints[0]
		if ep.Authorization == nil {
			t.Fatalf("PodMonitor %s names no credentials", crustd.Metadata.Name)
		}
		var token string
		waitFor(t, time.Minute, "the scraper's token in Secret "+ep.Authorization.Credentials.Name, func() (bool, error) {
			s, err := c.cs.CoreV1().Secrets("crust-system").Get(ctx, ep.Authorization.Credentials.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			token = string(s.Data[ep.Authorization.Credentials.Key])
			return token != "", nil
		})
		if n := c.scrapeTargets(t, crustd, "crust-system", token); n != 1 {
			t.Errorf("%d crustd targets up, want the node's one", n)
		}
	})
}

// readPodMonitor reads a PodMonitor of deploy/monitoring.
func (c *cluster) readPodMonitor(t *testing.T, file string) *podMonitor {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.root, "deploy", "monitoring", file))
	if err != nil {
		t.Fatal(err)
	}
	var m podMonitor
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Spec.Endpoints) != 1 {
		t.Fatalf("%s: %d endpoints, want 1", file, len(m.Spec.Endpoints))
	}
	return &m
}

// scrapeTargets scrapes each target m selects (running pods matching its selector, in namespace unless
// it selects any, that declare its port) and returns how many answered; a target that does not answer
// fails t.
func (c *cluster) scrapeTargets(t *testing.T, m *podMonitor, namespace, token string) int {
	t.Helper()
	if m.Spec.NamespaceSelector.Any {
		namespace = ""
	}
	sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.cs.CoreV1().Pods(namespace).List(ctxT(t), metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		t.Fatal(err)
	}
	ep := m.Spec.Endpoints[0]
	scheme := ep.Scheme
	if scheme == "" {
		scheme = "http"
	}
	up := 0
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		for _, ctr := range p.Spec.Containers {
			for _, port := range ctr.Ports {
				if port.Name != ep.Port {
					continue
				}
				url := fmt.Sprintf("%s://%s/%s", scheme, netJoin(p.Status.PodIP, port.ContainerPort), strings.TrimPrefix(ep.Path, "/"))
				body := c.scrape(t, &p, url, ep.TLSConfig != nil && ep.TLSConfig.InsecureSkipVerify, token)
				if !strings.Contains(body, "crust_build_info{") {
					t.Errorf("%s (pod %s/%s, container %s): no crust_build_info in\n%.300s", url, p.Namespace, p.Name, ctr.Name, body)
					continue
				}
				t.Logf("target up: %s (pod %s/%s, container %s)", url, p.Namespace, p.Name, ctr.Name)
				up++
			}
		}
	}
	return up
}

func netJoin(ip string, port int32) string {
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return ip + ":" + strconv.Itoa(int(port))
}

// scrape GETs url as Prometheus does (its Accept header, the bearer token) from the node, for a pod on
// the host network. The host has no route to the pod subnet: a request to another pod's IP would leave
// the machine, so scrape refuses one.
func (c *cluster) scrape(t *testing.T, p *corev1.Pod, url string, insecure bool, token string) string {
	t.Helper()
	if !p.Spec.HostNetwork {
		t.Fatalf("pod %s/%s is off the host network: its IP is not reachable on this machine", p.Namespace, p.Name)
	}
	args := []string{"--silent", "--show-error", "--fail", "--max-time", "10",
		"-H", "Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"}
	if insecure {
		args = append(args, "--insecure")
	}
	if token != "" {
		args = append(args, "-H", "Authorization: Bearer "+token)
	}
	args = append(args, url)
	var out []byte
	waitFor(t, time.Minute, "a scrape of "+url, func() (bool, error) {
		var err error
		out, err = exec.Command("curl", args...).CombinedOutput()
		return err == nil, fmt.Errorf("%v: %.300s", err, out)
	})
	return string(out)
}
