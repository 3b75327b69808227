package helm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// podMonitor is the part of a PodMonitor that says which pods and ports Prometheus scrapes.
type podMonitor struct {
	Metadata struct{ Name, Namespace string }
	Spec     struct {
		NamespaceSelector   struct{ Any bool }
		Selector            struct{ MatchLabels map[string]string }
		PodMetricsEndpoints []struct {
			Port, Scheme  string
			Authorization *struct {
				Credentials struct{ Name, Key string }
			}
		}
	}
}

// podTemplates returns the pod templates of the workloads in objs, keyed by KIND/NAMESPACE/NAME.
func podTemplates(t *testing.T, objs map[string]map[string]any) map[string]corev1.PodTemplateSpec {
	t.Helper()
	templates := map[string]corev1.PodTemplateSpec{}
	for k, o := range objs {
		switch o["kind"] {
		case "DaemonSet", "Deployment", "StatefulSet":
		default:
			continue
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var w struct {
			Metadata struct{ Namespace string }
			Spec     struct{ Template corev1.PodTemplateSpec }
		}
		if err := yaml.Unmarshal(b, &w); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		w.Spec.Template.Namespace = w.Metadata.Namespace
		templates[k] = w.Spec.Template
	}
	return templates
}

// selected returns the templates whose pods pm selects.
func (pm *podMonitor) selected(templates map[string]corev1.PodTemplateSpec) map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for k, tmpl := range templates {
		if !pm.Spec.NamespaceSelector.Any && tmpl.Namespace != pm.Metadata.Namespace {
			continue
		}
		match := len(pm.Spec.Selector.MatchLabels) > 0
		for l, v := range pm.Spec.Selector.MatchLabels {
			match = match && tmpl.Labels[l] == v
		}
		if match {
			out[k] = tmpl
		}
	}
	return out
}

// containerWithPort returns the container of tmpl that declares the port named name.
func containerWithPort(tmpl corev1.PodTemplateSpec, name string) (*corev1.Container, *corev1.ContainerPort) {
	for i, c := range tmpl.Spec.Containers {
		for j, p := range c.Ports {
			if p.Name == name {
				return &tmpl.Spec.Containers[i], &tmpl.Spec.Containers[i].Ports[j]
			}
		}
	}
	return nil, nil
}

func decodePodMonitor(t *testing.T, o map[string]any) *podMonitor {
	t.Helper()
	b, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	pm := &podMonitor{}
	if err := yaml.Unmarshal(b, pm); err != nil {
		t.Fatal(err)
	}
	return pm
}

// The crustd PodMonitor of an install as deploy/monitoring/README.md gives it (deploy/, deploy/monitoring
// and the Component deploy/metrics-auth) selects crustd's pods, on a port crustd serves on the node's
// address, with a token Kubernetes fills in for a service account allowed to read /metrics. Without the
// Component the port is not there: the reason the README asks for it.
func TestCrustdPodMonitorTarget(t *testing.T) {
	build := func(trees ...string) map[string]map[string]any {
		objs := map[string]map[string]any{}
		for _, tree := range trees {
			out, err := kustomizeBuild(tree)
			if err != nil {
				t.Fatal(err)
			}
			for k, o := range decode(t, out) {
				objs[k] = o
			}
		}
		return objs
	}
	monitoring := filepath.Join(deployDir, "monitoring")
	objs := build(withComponent(t, deployDir, filepath.Join(deployDir, "metrics-auth")), monitoring)
	pm := decodePodMonitor(t, objs["PodMonitor/"+namespace+"/crustd"])
	pods := pm.selected(podTemplates(t, objs))
	if len(pods) != 1 || pods["DaemonSet/"+namespace+"/crustd"].Labels == nil {
		t.Fatalf("PodMonitor crustd selects %d workloads, want crustd's DaemonSet alone", len(pods))
	}
	tmpl := pods["DaemonSet/"+namespace+"/crustd"]
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("PodMonitor crustd has %d endpoints, want 1", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	c, port := containerWithPort(tmpl, ep.Port)
	if c == nil {
		t.Fatalf("crustd's pod declares no port %q", ep.Port)
	}
	// The pod's IP is the node's (hostNetwork): crustd must bind the node's address on that port.
	bind := "--metrics-secure-addr=$(NODE_IP):" + strconv.Itoa(int(port.ContainerPort))
	if !tmpl.Spec.HostNetwork || !slices.Contains(c.Args, bind) || ep.Scheme != "https" {
		t.Errorf("port %s (%d, scheme %q): crustd's args %q lack %s on the host network", ep.Port, port.ContainerPort, ep.Scheme, c.Args, bind)
	}
	if ep.Authorization == nil {
		t.Fatal("PodMonitor crustd sends no credentials; the endpoint answers 401 without")
	}
	cred := ep.Authorization.Credentials
	secret := objs["Secret/"+namespace+"/"+cred.Name]
	if secret == nil {
		t.Fatalf("no Secret %s in %s, where the PodMonitor takes its token", cred.Name, namespace)
	}
	sa, _ := secret["metadata"].(map[string]any)["annotations"].(map[string]any)["kubernetes.io/service-account.name"].(string)
	if secret["type"] != string(corev1.SecretTypeServiceAccountToken) || cred.Key != corev1.ServiceAccountTokenKey || objs["ServiceAccount/"+namespace+"/"+sa] == nil {
		t.Errorf("Secret %s (type %v, service account %q, key %q): not a token Kubernetes fills in for a service account here", cred.Name, secret["type"], sa, cred.Key)
	}
	bound := false
	for k, o := range objs {
		if !strings.HasPrefix(k, "ClusterRoleBinding/") || o["roleRef"].(map[string]any)["name"] != "crust-metrics-reader" {
			continue
		}
		for _, s := range o["subjects"].([]any) {
			s := s.(map[string]any)
			bound = bound || (s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == namespace)
		}
	}
	if !bound || objs["ClusterRole/crust-metrics-reader"] == nil {
		t.Errorf("service account %s is not bound to the ClusterRole crust-metrics-reader", sa)
	}

	plain := build(deployDir)
	if c, _ := containerWithPort(podTemplates(t, plain)["DaemonSet/"+namespace+"/crustd"], ep.Port); c != nil {
		t.Errorf("deploy/ alone declares port %s: the README's reason to install deploy/metrics-auth is gone", ep.Port)
	}
}

// The proxy's PodMonitor selects the pods `kubectl crust inject` gives a proxy, on the port each proxy
// declares, and a proxy in a pod without hostNetwork binds that port on the pod's IP (every address), as
// deploy/monitoring/README.md says; in a hostNetwork pod it keeps to the node's loopback.
func TestCSIProxyPodMonitorTarget(t *testing.T) {
	out, err := kustomizeBuild(filepath.Join(deployDir, "monitoring"))
	if err != nil {
		t.Fatal(err)
	}
	pm := decodePodMonitor(t, decode(t, out)["PodMonitor/"+namespace+"/crust-csi-proxy"])
	if !pm.Spec.NamespaceSelector.Any || len(pm.Spec.PodMetricsEndpoints) == 0 {
		t.Fatalf("PodMonitor crust-csi-proxy: want every namespace and an endpoint, have %+v", pm.Spec)
	}
	ports := map[string]bool{}
	for _, ep := range pm.Spec.PodMetricsEndpoints {
		ports[ep.Port] = true
	}

	bin := buildKubectlCrust(t)
	const ns = "some-driver"
	cmd := exec.Command(bin, "inject", "--namespace="+ns)
	cmd.Stdin, cmd.Stderr = bytes.NewReader(install(t, driverWithoutCrust(t), ns, nil, nil)), os.Stderr
	injected, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl-crust inject: %v", err)
	}
	templates := podTemplates(t, decode(t, injected))
	pods := pm.selected(templates)
	for k, tmpl := range templates {
		hasProxy := slices.ContainsFunc(tmpl.Spec.Containers, func(c corev1.Container) bool { return strings.HasPrefix(c.Name, "crust-csi-proxy") })
		if _, ok := pods[k]; ok != hasProxy {
			t.Errorf("%s: has a proxy %v, selected by the PodMonitor %v", k, hasProxy, ok)
		}
	}
	if len(pods) == 0 {
		t.Fatal("the PodMonitor selects none of the injected driver's pods")
	}
	for k, tmpl := range pods {
		for _, c := range tmpl.Spec.Containers {
			if !strings.HasPrefix(c.Name, "crust-csi-proxy") {
				continue
			}
			i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return ports[p.Name] })
			if i < 0 {
				t.Errorf("%s: container %s declares none of the ports %v", k, c.Name, ports)
				continue
			}
			want := "--http-addr=:" + strconv.Itoa(int(c.Ports[i].ContainerPort))
			if tmpl.Spec.HostNetwork {
				want = "--http-addr=127.0.0.1:" + strconv.Itoa(int(c.Ports[i].ContainerPort))
			}
			if !slices.Contains(c.Args, want) {
				t.Errorf("%s: container %s (hostNetwork %v) has args %q, want %s", k, c.Name, tmpl.Spec.HostNetwork, c.Args, want)
			}
		}
	}
}
