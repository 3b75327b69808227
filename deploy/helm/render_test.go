package helm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/postrender"
	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	deployDir = ".."           // deploy/, the kustomize tree: the source
	chartDir  = "crust"        // the chart rendered from it
	namespace = "crust-system" // deploy/kustomization.yaml's namespace, and the test's release namespace
)

// The chart's intended differences from deploy/: everything else must be equal, object for object and
// field for field.
var (
	// helmLabels are the labels the chart adds to the metadata of each of its objects (templates/
	// _helpers.tpl, crust.labels); deploy/ has none of them.
	helmLabels = map[string]string{
		"helm.sh/chart":                "crust-0.2.0-dev",
		"app.kubernetes.io/managed-by": "Helm",
	}
	// onlyKustomize are the objects of deploy/ that the chart does not render: the namespace, which a
	// release must find in place (Helm records the release in it first) and which needs its Pod Security
	// labels (README.md here).
	onlyKustomize = []string{"Namespace/" + namespace}
)

// TestChartRendersDeploy is the single-source rule: the chart with its default values renders what
// `kubectl kustomize deploy/` does, and with monitoring.enabled what deploy/ with deploy/metrics-auth and
// deploy/monitoring do together, but for the differences listed above.
func TestChartRendersDeploy(t *testing.T) {
	for _, c := range []struct {
		name   string
		values map[string]any
		trees  []string
	}{
		{"defaults", nil, []string{deployDir}},
		// Its crustd PodMonitor scrapes the endpoint of deploy/metrics-auth, which the chart turns on with it.
		{"monitoring", map[string]any{"monitoring": map[string]any{"enabled": true}},
			[]string{withComponent(t, deployDir, filepath.Join(deployDir, "metrics-auth")), filepath.Join(deployDir, "monitoring")}},
		{"metrics-auth", map[string]any{"metrics": map[string]any{"secure": map[string]any{"enabled": true}}},
			[]string{withComponent(t, deployDir, filepath.Join(deployDir, "metrics-auth"))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := map[string]map[string]any{}
			for _, tree := range c.trees {
				out, err := kustomizeBuild(tree)
				if err != nil {
					t.Fatal(err)
				}
				for k, o := range decode(t, out) {
					want[k] = o
				}
			}
			for _, k := range onlyKustomize {
				if want[k] == nil {
					t.Errorf("%s is listed as only in deploy/, but deploy/ does not render it", k)
				}
				delete(want, k)
			}
			got := decode(t, helmTemplate(t, c.values))
			for k, o := range got {
				dropHelmLabels(t, k, o)
			}
			var names []string
			for _, tree := range c.trees {
				names = append(names, inRepo(tree))
			}
			compare(t, "kustomize "+strings.Join(names, " + "), want, "helm template "+inRepo(chartDir), got)
		})
	}
}

// withComponent returns a kustomization of base with component, as an operator writes one.
func withComponent(t *testing.T, base, component string) string {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(dir, abs) // kustomize takes only relative paths to other kustomizations
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\n", rel(base), rel(component))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The chart reads deploy/monitoring's files from files/ (a chart reaches no file outside its directory):
// they must be copies of deploy/monitoring's, byte for byte, comments included.
func TestChartMonitoringFilesAreDeploys(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(chartDir, "files"))
	if err != nil || len(entries) == 0 {
		t.Fatalf("no files in %s/files: %v", chartDir, err)
	}
	for _, e := range entries {
		copied, err := os.ReadFile(filepath.Join(chartDir, "files", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		source, err := os.ReadFile(filepath.Join(deployDir, "monitoring", e.Name()))
		if err != nil {
			t.Errorf("%s/files/%s has no source in deploy/monitoring: %v", chartDir, e.Name(), err)
			continue
		}
		if !bytes.Equal(copied, source) {
			t.Errorf("%s/files/%s differs from deploy/monitoring/%s: copy it again (cp deploy/monitoring/%[2]s deploy/helm/%[1]s/files/)",
				chartDir, e.Name(), e.Name())
		}
	}
}

// monitoring.prometheusSelector labels what a Prometheus selects (the PodMonitors and the PrometheusRule),
// and nothing else; monitoring.podMonitor alone turns crustd's authenticated endpoint on.
func TestChartPrometheusSelector(t *testing.T) {
	out := helmTemplate(t, map[string]any{"monitoring": map[string]any{"enabled": true,
		"prometheusSelector": map[string]any{"release": "kube-prometheus-stack"}}})
	selected := map[string]bool{}
	for k, o := range decode(t, out) {
		labels, _ := o["metadata"].(map[string]any)["labels"].(map[string]any)
		if labels["release"] == "kube-prometheus-stack" {
			selected[k] = true
		}
		if k == "DaemonSet/"+namespace+"/crustd" {
			b, err := yaml.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "--metrics-secure-addr=") {
				t.Errorf("monitoring.enabled: crustd does not serve the endpoint its PodMonitor scrapes:\n%s", b)
			}
		}
	}
	want := map[string]bool{
		"PodMonitor/" + namespace + "/crustd":          true,
		"PodMonitor/" + namespace + "/crust-csi-proxy": true,
		"PrometheusRule/" + namespace + "/crust":       true,
	}
	if d := cmp.Diff(want, selected); d != "" {
		t.Errorf("objects labelled release: kube-prometheus-stack (-want +got):\n%s", d)
	}
}

// The values other than the defaults reach every field they promise to, and the DaemonSet they render is
// still a valid one (decoded strictly).
func TestChartValues(t *testing.T) {
	out := helmTemplate(t, map[string]any{
		"image":      map[string]any{"repository": "registry.example.com/crust/crustd", "tag": "v9.9.9", "pullPolicy": "Always"},
		"kubeletDir": "/data/kubelet",
		"kataDir":    "/run/kata/dv",
		"log":        map[string]any{"level": "debug"},
		"metrics":    map[string]any{"port": 19809, "listenOnNodeIP": true},
		"extraArgs":  []any{"--device-allow-kind=loop,dm"},
		"resources":  map[string]any{"limits": map[string]any{"memory": "256Mi"}},
	})
	var ds *appsv1.DaemonSet
	for _, doc := range splitDocs(t, out) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		if head.Kind == "DaemonSet" {
			ds = &appsv1.DaemonSet{}
			if err := yaml.UnmarshalStrict(doc, ds); err != nil {
				t.Fatalf("DaemonSet: %v", err)
			}
		}
	}
	if ds == nil {
		t.Fatalf("no DaemonSet in\n%s", out)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--kubelet-dir=/data/kubelet", "--kata-dir=/run/kata/dv", "--log-level=debug",
		"--http-addr=$(NODE_IP):19809", "--device-allow-kind=loop,dm"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if c.Image != "registry.example.com/crust/crustd:v9.9.9" || c.ImagePullPolicy != "Always" {
		t.Errorf("image %s, pull policy %s", c.Image, c.ImagePullPolicy)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "NODE_IP" || c.Env[0].ValueFrom.FieldRef.FieldPath != "status.hostIP" {
		t.Errorf("env %+v: want NODE_IP from status.hostIP", c.Env)
	}
	for _, p := range []struct{ host, port string }{
		{c.LivenessProbe.HTTPGet.Host, c.LivenessProbe.HTTPGet.Port.String()},
		{c.ReadinessProbe.HTTPGet.Host, c.ReadinessProbe.HTTPGet.Port.String()},
	} {
		if p.host != "" || p.port != "19809" { // the pod's IP, which is the node's
			t.Errorf("probe to %q:%s, want the pod's IP and 19809", p.host, p.port)
		}
	}
	if c.Ports[0].ContainerPort != 19809 {
		t.Errorf("port %d", c.Ports[0].ContainerPort)
	}
	// Helm merges a map of values into the default's: the requests stay.
	if c.Resources.Limits.Memory().String() != "256Mi" || c.Resources.Requests.Cpu().String() != "5m" {
		t.Errorf("resources %v: want the limit of the values and the default's requests", c.Resources)
	}
	paths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		paths[v.Name] = v.HostPath.Path
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for name, want := range map[string]string{"kubelet": "/data/kubelet", "kata-direct-volumes": "/run/kata/dv"} {
		if paths[name] != want || mounts[name] != want {
			t.Errorf("volume %s: host path %s, mounted at %s; want both %s", name, paths[name], mounts[name], want)
		}
	}
}

// inRepo names a path of this directory as from the repository's root (deploy/...), for messages.
func inRepo(p string) string {
	return filepath.ToSlash(filepath.Join("deploy", "helm", p))
}

// kustomizeBuild is `kustomize build dir` with kustomize's default options (kubectl kustomize's too).
func kustomizeBuild(dir string) ([]byte, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m.AsYaml()
}

// helmTemplate is `helm template crust deploy/helm/crust -n crust-system` with values.
func helmTemplate(t *testing.T, values map[string]any) []byte {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return install(t, c, namespace, values, nil)
}

// install renders c as `helm template` (or `helm install --dry-run`, which gives the same manifest)
// would, in namespace, post-rendered by pr when it is not nil.
func install(t *testing.T, c *chart.Chart, namespace string, values map[string]any, pr postrender.PostRenderer) []byte {
	t.Helper()
	m, err := render(t, c, namespace, values, pr)
	if err != nil {
		t.Fatalf("helm template %s: %v", c.Name(), err)
	}
	return m
}

// render is install's, returning the error.
func render(t *testing.T, c *chart.Chart, namespace string, values map[string]any, pr postrender.PostRenderer) ([]byte, error) {
	i := action.NewInstall(&action.Configuration{Log: t.Logf})
	i.DryRun, i.ClientOnly, i.Replace = true, true, true
	i.ReleaseName, i.Namespace = c.Name(), namespace
	i.PostRenderer = pr
	rel, err := i.Run(c, values)
	if err != nil {
		return nil, err
	}
	return []byte(rel.Manifest), nil
}

// splitDocs splits a stream of YAML documents, dropping the empty ones.
func splitDocs(t *testing.T, stream []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) > 0 && string(bytes.TrimSpace(doc)) != "---" {
			docs = append(docs, doc)
		}
	}
}

// decode reads a stream of YAML documents into objects keyed KIND/NAMESPACE/NAME (KIND/NAME for those
// without a namespace). A key met twice fails the test.
func decode(t *testing.T, stream []byte) map[string]map[string]any {
	t.Helper()
	objs := map[string]map[string]any{}
	for _, doc := range splitDocs(t, stream) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if o == nil {
			continue // comments only
		}
		meta, _ := o["metadata"].(map[string]any)
		key := fmt.Sprint(o["kind"], "/", meta["name"])
		if ns, ok := meta["namespace"]; ok {
			key = fmt.Sprint(o["kind"], "/", ns, "/", meta["name"])
		}
		if objs[key] != nil {
			t.Fatalf("%s twice", key)
		}
		objs[key] = o
	}
	return objs
}

// dropHelmLabels removes helmLabels from o's metadata, failing the test when one is missing or other.
func dropHelmLabels(t *testing.T, key string, o map[string]any) {
	t.Helper()
	meta := o["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	for l, v := range helmLabels {
		if labels[l] != v {
			t.Errorf("%s: label %s is %v, want %s", key, l, labels[l], v)
		}
		delete(labels, l)
	}
	if len(labels) == 0 {
		delete(meta, "labels")
	}
}

// compare fails the test for each object that is not in both sets, or differs between them.
func compare(t *testing.T, wantName string, want map[string]map[string]any, gotName string, got map[string]map[string]any) {
	t.Helper()
	keys := map[string]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		switch {
		case got[k] == nil:
			t.Errorf("%s: in %s, not in %s", k, wantName, gotName)
		case want[k] == nil:
			t.Errorf("%s: in %s, not in %s", k, gotName, wantName)
		default:
			if d := cmp.Diff(want[k], got[k]); d != "" {
				t.Errorf("%s differs (-%s +%s):\n%s", k, wantName, gotName, d)
			}
		}
	}
	if len(sorted) == 0 {
		t.Errorf("no objects in %s nor in %s", wantName, gotName)
	}
}
