package helm

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// daemonSet returns crustd's DaemonSet from the chart's rendered output, decoded strictly (a field the
// API does not know fails the test).
func daemonSet(t *testing.T, out []byte) *appsv1.DaemonSet {
	t.Helper()
	o := decode(t, out)["DaemonSet/"+namespace+"/crustd"]
	if o == nil {
		t.Fatal("the chart renders no DaemonSet crustd")
	}
	b, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	ds := &appsv1.DaemonSet{}
	if err := yaml.UnmarshalStrict(b, ds); err != nil {
		t.Fatalf("DaemonSet crustd: %v", err)
	}
	return ds
}

// distributions are the kubelet roots and CRI endpoints of docs/operators.md (Distributions); kustomize
// names the directory of deploy/distributions that patches deploy/ for the same ("" for none).
var distributions = []struct {
	name, kubeletDir, criEndpoint, criDir, kustomize string
}{
	{"k0s", "/var/lib/k0s/kubelet", "unix:///run/k0s/containerd.sock", "/run/k0s", "k0s"},
	{"microk8s", "/var/snap/microk8s/common/var/lib/kubelet", "unix:///var/snap/microk8s/common/run/containerd.sock", "/var/snap/microk8s/common/run", "microk8s"},
	{"k3s", "/var/lib/kubelet", "unix:///run/k3s/containerd/containerd.sock", "/run/k3s/containerd", "k3s"},
	{"cri-o", "/var/lib/kubelet", "unix:///run/crio/crio.sock", "/run/crio", ""},
	{"no CRI look-ups", "/var/lib/kubelet", "", "", ""},
}

// With a distribution's kubeletDir and criEndpoint, every host path that follows them moves (kubelet's
// root, and the CRI socket's directory, mounted at the same path so that --cri-endpoint names the socket
// inside the container), and nothing is left at the upstream paths.
func TestChartDistributions(t *testing.T) {
	for _, c := range distributions {
		t.Run(c.name, func(t *testing.T) {
			out := helmTemplate(t, map[string]any{"kubeletDir": c.kubeletDir, "criEndpoint": c.criEndpoint})
			spec := daemonSet(t, out).Spec.Template.Spec
			hostPaths := map[string]string{}
			for _, v := range spec.Volumes {
				hostPaths[v.Name] = v.HostPath.Path
			}
			mounts := map[string]string{}
			for _, m := range spec.Containers[0].VolumeMounts {
				mounts[m.Name] = m.MountPath
			}
			want := map[string]string{"kubelet": c.kubeletDir, "cri": c.criDir}
			for name, path := range want {
				if hostPaths[name] != path || mounts[name] != path {
					t.Errorf("volume %s: host path %q, mounted at %q; want both %q", name, hostPaths[name], mounts[name], path)
				}
			}
			args := strings.Join(spec.Containers[0].Args, " ")
			for _, a := range []string{"--kubelet-dir=" + c.kubeletDir, "--cri-endpoint=" + c.criEndpoint} {
				if !strings.Contains(args, a+" ") {
					t.Errorf("args %q lack %s", args, a)
				}
			}
			if socket := strings.TrimPrefix(c.criEndpoint, "unix://"); socket != "" && !strings.HasPrefix(socket, c.criDir+"/") {
				t.Errorf("the CRI socket %s is not in the mounted directory %s", socket, c.criDir)
			}
			// Nothing of the upstream layout is left behind, anywhere in the output, where it moved.
			for upstream, moved := range map[string]bool{
				"/var/lib/kubelet": c.kubeletDir != "/var/lib/kubelet",
				"/run/containerd":  c.criDir != "/run/containerd",
			} {
				// The path itself, not the tail of another (microk8s's kubelet root ends in /var/lib/kubelet).
				whole := regexp.MustCompile(`(^|[\s="':])` + regexp.QuoteMeta(upstream) + `($|[/\s"'])`)
				if moved && whole.Match(out) {
					t.Errorf("%s is left in the output:\n%s", upstream, out)
				}
			}
		})
	}
}

// deploy/ with the Component deploy/distributions/NAME renders crustd's pod as the chart does with that
// distribution's values.
func TestKustomizeDistributions(t *testing.T) {
	for _, c := range distributions {
		if c.kustomize == "" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			component := filepath.Join(deployDir, "distributions", c.kustomize)
			out, err := kustomizeBuild(withComponent(t, deployDir, component))
			if err != nil {
				t.Fatal(err)
			}
			want := daemonSet(t, helmTemplate(t, map[string]any{"kubeletDir": c.kubeletDir, "criEndpoint": c.criEndpoint}))
			if d := cmp.Diff(want.Spec, daemonSet(t, out).Spec); d != "" {
				t.Errorf("crustd's DaemonSet differs (-helm template +kustomize build %s):\n%s", inRepo(component), d)
			}
		})
	}
}

// nonDefaults sets every value of the chart to something other than its default.
var nonDefaults = map[string]any{
	"image":             map[string]any{"repository": "registry.example.com/crust/crustd", "tag": "v9.9.9", "pullPolicy": "Always"},
	"imagePullSecrets":  []any{map[string]any{"name": "registry-example-com"}},
	"podLabels":         map[string]any{"team": "storage"},
	"podAnnotations":    map[string]any{"example.com/owner": "storage"},
	"priorityClassName": "",
	"runtimeClassName":  "runc",
	"updateStrategy":    map[string]any{"type": "OnDelete"},
	"kubeletDir":        "/var/lib/k0s/kubelet",
	"kataDir":           "/run/kata/dv",
	"criEndpoint":       "",
	"deviceAllow":       "/dev/loop*",
	"log":               map[string]any{"level": "debug", "format": "text"},
	"metrics":           map[string]any{"port": 19809, "listenOnNodeIP": true, "secure": map[string]any{"enabled": true, "port": 19443}},
	"affinity":          map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "example.com/vm", "operator": "Exists"}}}}}}},
	"nodeSelector":      map[string]any{"kubernetes.io/arch": "amd64"},
	"tolerations":       []any{map[string]any{"operator": "Exists"}},
	"resources":         map[string]any{"limits": map[string]any{"memory": "256Mi", "cpu": "1"}},
	"extraArgs":         []any{"--device-allow-kind=loop,dm"},
	"monitoring":        map[string]any{"enabled": true},
}

// `helm lint` (Helm's lint package, which `helm lint` runs) finds nothing of severity warning or above in
// the chart, with its default values and with nonDefaults.
func TestChartLint(t *testing.T) {
	for name, values := range map[string]map[string]any{"defaults": nil, "non-defaults": nonDefaults} {
		t.Run(name, func(t *testing.T) {
			l := lint.All(chartDir, values, namespace, true)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %v", m)
				} else {
					t.Logf("helm lint: %v", m)
				}
			}
		})
	}
}

// The values of the pod's metadata and scheduling reach the DaemonSet, and leave its selector alone.
func TestChartPodValues(t *testing.T) {
	ds := daemonSet(t, helmTemplate(t, nonDefaults))
	pod := ds.Spec.Template
	if pod.Labels["team"] != "storage" || pod.Labels["app.kubernetes.io/name"] != "crustd" || pod.Annotations["example.com/owner"] != "storage" {
		t.Errorf("pod labels %v, annotations %v", pod.Labels, pod.Annotations)
	}
	if len(ds.Spec.Selector.MatchLabels) != 1 || ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "crustd" {
		t.Errorf("selector %v: want app.kubernetes.io/name=crustd alone", ds.Spec.Selector.MatchLabels)
	}
	if s := ds.Spec.UpdateStrategy; s.Type != appsv1.OnDeleteDaemonSetStrategyType || s.RollingUpdate != nil {
		t.Errorf("updateStrategy %+v: want OnDelete without rollingUpdate (the API refuses it)", s)
	}
	spec := pod.Spec
	if spec.PriorityClassName != "" || len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "registry-example-com" {
		t.Errorf("priorityClassName %q, imagePullSecrets %v", spec.PriorityClassName, spec.ImagePullSecrets)
	}
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "runc" {
		t.Errorf("runtimeClassName %v, want runc", spec.RuntimeClassName)
	}
	if spec.NodeSelector["kubernetes.io/arch"] != "amd64" || spec.Tolerations[0].Key != "" {
		t.Errorf("nodeSelector %v, tolerations %v", spec.NodeSelector, spec.Tolerations)
	}
	// A list replaces the default's: one term, the values'.
	if terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; len(terms) != 1 ||
		terms[0].MatchExpressions[0].Key != "example.com/vm" {
		t.Errorf("node affinity terms %+v: want the values' one", terms)
	}
}

// values.schema.json refuses a bad value before anything renders, naming the value and what it may be.
func TestChartSchema(t *testing.T) {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		values map[string]any
		want   []string // in the error
	}{
		{map[string]any{"log": map[string]any{"level": "loud"}}, []string{"/log/level", "'debug', 'info', 'warn', 'error'"}},
		{map[string]any{"log": map[string]any{"format": "xml"}}, []string{"/log/format", "'json', 'text'"}},
		{map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, []string{"/image/pullPolicy"}},
		{map[string]any{"updateStrategy": map[string]any{"type": "Recreate"}}, []string{"/updateStrategy/type"}},
		{map[string]any{"metrics": map[string]any{"port": "9809"}}, []string{"/metrics/port", "integer"}},
		{map[string]any{"kubeletDir": "var/lib/kubelet"}, []string{"/kubeletDir"}},
		{map[string]any{"criEndpoint": "tcp://10.0.0.1:1234"}, []string{"/criEndpoint"}},
		{map[string]any{"podLabels": map[string]any{"app.kubernetes.io/name": "other"}}, []string{"/podLabels/app.kubernetes.io~1name"}},
		{map[string]any{"imagePullSecrets": []any{"registry-example-com"}}, []string{"/imagePullSecrets/0"}},
	} {
		_, err := chartutil.ToRenderValues(c, tc.values, chartutil.ReleaseOptions{Name: "crust", Namespace: namespace}, nil)
		if err == nil {
			t.Errorf("values %v: accepted", tc.values)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("values %v: error %q does not say %q", tc.values, err, w)
			}
		}
	}
	for name, values := range map[string]map[string]any{"defaults": nil, "non-defaults": nonDefaults} {
		if _, err := chartutil.ToRenderValues(c, values, chartutil.ReleaseOptions{Name: "crust", Namespace: namespace}, nil); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// NOTES.txt names what was installed and the next steps: the node label (as the default affinity wants
// it, or the operator's own choice), the proxy's injection and the classes.
func TestChartNotes(t *testing.T) {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string
	}{
		{"defaults", nil, []string{"crust " + c.Metadata.AppVersion + " is installed in the namespace " + namespace,
			"carry crust.dev/microvm=true or\n   katacontainers.io/kata-runtime=true", "kubectl label node NODE crust.dev/microvm=true",
			"kubectl -n " + namespace + " rollout status daemonset/crustd", "kubectl crust inject", "crust.dev/defer"}},
		{"non-defaults", nonDefaults, []string{"registry.example.com/crust/crustd:v9.9.9", "crust's monitoring objects",
			"your affinity and nodeSelector values select"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := chartutil.ToRenderValues(c, tc.values, chartutil.ReleaseOptions{Name: "crust", Namespace: namespace}, nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := engine.Render(c, v)
			if err != nil {
				t.Fatal(err)
			}
			notes := out[c.Name()+"/templates/NOTES.txt"]
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES.txt lacks %q:\n%s", w, notes)
				}
			}
		})
	}
}
