package helm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/postrender"
	helm4 "helm.sh/helm/v4/pkg/cli"
	postrender4 "helm.sh/helm/v4/pkg/postrenderer"
	"sigs.k8s.io/yaml"
)

const (
	postRenderer = "csi-proxy-post-renderer.sh" // Helm 3's
	plugin       = "crust-inject"               // Helm 4's, a directory here
)

// TestPostRenderers installs, with Helm 3 and its path-based post-renderer, and runs through Helm 4's
// plugin runtime with the post-renderer plugin, a chart that knows nothing of crust (the example LVM
// driver, its namespaces dropped as a chart's templates leave them to the release), giving each only the
// release's namespace. Each must give what `kubectl crust inject -n NS` gives for the chart's output: the
// node proxy in the DaemonSet, the controller proxy in the Deployment, crust's role bound to the pod's
// own ServiceAccount in the release's namespace.
func TestPostRenderers(t *testing.T) {
	bin := buildKubectlCrust(t)
	t.Setenv("PATH", filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	const ns = "some-driver"
	driverChart := driverWithoutCrust(t)
	rendered := install(t, driverChart, ns, nil, nil)

	cmd := exec.Command(bin, "inject", "--namespace="+ns)
	cmd.Stdin, cmd.Stderr = bytes.NewReader(rendered), os.Stderr
	direct, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl-crust inject: %v", err)
	}
	want := decode(t, direct)
	for _, key := range []string{"DaemonSet/crust-lvm-csi-node", "Deployment/crust-lvm-csi-controller",
		"ClusterRoleBinding/crust-csi-proxy:" + ns + ":crust-lvm-csi-node"} {
		if _, ok := want[key]; !ok {
			keys := make([]string, 0, len(want))
			for k := range want {
				keys = append(keys, k)
			}
			t.Fatalf("inject's output lacks %s; it holds %q", key, keys)
		}
	}
	for _, c := range []string{"crust-csi-proxy", "crust-csi-proxy-controller"} {
		if !bytes.Contains(direct, []byte("name: "+c+"\n")) {
			t.Errorf("inject's output has no container %s", c)
		}
	}

	t.Run("helm3", func(t *testing.T) {
		pr, err := postrender.NewExec("./"+postRenderer, "--namespace="+ns)
		if err != nil {
			t.Fatal(err)
		}
		compare(t, "kubectl crust inject", want, "helm install with "+postRenderer, decode(t, install(t, driverChart, ns, nil, pr)))
	})
	t.Run("helm4", func(t *testing.T) {
		plugins := t.TempDir()
		abs, err := filepath.Abs(plugin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(plugins, plugin)); err != nil { // as `helm plugin install DIR` does
			t.Fatal(err)
		}
		settings := helm4.New()
		settings.PluginsDirectory = plugins
		pr, err := postrender4.NewPostRendererPlugin(settings, plugin, "--namespace="+ns)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pr.Run(bytes.NewBuffer(rendered))
		if err != nil {
			t.Fatal(err)
		}
		compare(t, "kubectl crust inject", want, "Helm 4 post-renderer plugin "+plugin, decode(t, out.Bytes()))
	})
	t.Run("refusal", func(t *testing.T) {
		// Without the namespace the chart's objects lack, the install fails and names why.
		pr, err := postrender.NewExec("./" + postRenderer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := render(t, driverChart, ns, nil, pr); err == nil || !strings.Contains(err.Error(), "names no namespace") {
			t.Errorf("install without --namespace: %v", err)
		}
	})
}

// driverWithoutCrust is the example LVM driver as a chart that knows nothing of crust would render it.
func driverWithoutCrust(t *testing.T) *chart.Chart {
	t.Helper()
	driver, err := kustomizeBuild(filepath.Join(deployDir, "examples", "lvm-driver"))
	if err != nil {
		t.Fatal(err)
	}
	var plain []string
	for _, doc := range splitDocs(t, driver) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatal(err)
		}
		meta := o["metadata"].(map[string]any)
		delete(meta, "namespace")
		if labels, ok := meta["labels"].(map[string]any); ok {
			delete(labels, "crust.dev/csi-proxy")
		}
		if o["kind"] == "Namespace" {
			continue // a chart's release namespace exists before the release
		}
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		plain = append(plain, string(b))
	}
	return &chart.Chart{
		Metadata:  &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "some-driver", Version: "1.0.0"},
		Templates: []*chart.File{{Name: "templates/driver.yaml", Data: []byte(strings.Join(plain, "---\n"))}},
	}
}

// buildKubectlCrust builds crust's kubectl plugin from this checkout, as `make build` does.
func buildKubectlCrust(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-crust")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubectl-crust")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "GOWORK=") // the repository's workspace, not this module's GOWORK=off
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build kubectl-crust: %v\n%s", err, out)
	}
	return bin
}

// TestComponentCheck: the kustomize Component patches nothing when no object carries its label when it
// runs, and kustomize cannot fail on that; `kubectl crust inject --check` on the build does, naming each
// driver pod left without a proxy, and passes a build whose pods have theirs. Three builds: the driver's
// objects labelled before the Component runs (the proxies are added); no label; and the label added by the
// including kustomization itself, which kustomize applies after its components (no proxy, silently).
func TestComponentCheck(t *testing.T) {
	bin := buildKubectlCrust(t)
	const label = "labels:\n  - pairs: {crust.dev/csi-proxy: enabled}\n"
	build := func(driverLabels, topLabels string) []byte {
		t.Helper()
		dir := t.TempDir()
		rel := func(from, p string) string {
			abs, err := filepath.Abs(p)
			if err == nil {
				p, err = filepath.Rel(from, abs)
			}
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		write := func(d, k string) {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(filepath.Join(dir, "driver"), "resources: ["+rel(filepath.Join(dir, "driver"), filepath.Join(deployDir, "examples", "lvm-driver"))+"]\n"+driverLabels)
		write(dir, "namespace: some-driver\nresources: [driver]\ncomponents: ["+rel(dir, filepath.Join(deployDir, "csi-proxy"))+"]\n"+topLabels)
		out, err := kustomizeBuild(dir)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	check := func(in []byte) (string, error) {
		cmd := exec.Command(bin, "inject", "--check")
		var stderr bytes.Buffer
		cmd.Stdin, cmd.Stderr = bytes.NewReader(in), &stderr
		out, err := cmd.Output()
		if err == nil && !bytes.Equal(out, in) {
			t.Errorf("inject --check changed its input")
		}
		return stderr.String(), err
	}
	if msg, err := check(build(label, "")); err != nil {
		t.Errorf("the driver labelled for the Component: %v: %s", err, msg)
	}
	for name, top := range map[string]string{"no label": "", "the label added after the Component": label} {
		msg, err := check(build("", top))
		for _, want := range []string{"DaemonSet some-driver/crust-lvm-csi-node: it has no crust-csi-proxy", "Deployment some-driver/crust-lvm-csi-controller: it has no crust-csi-proxy"} {
			if err == nil || !strings.Contains(msg, want) {
				t.Errorf("%s: %v, stderr %q; want %q", name, err, msg, want)
			}
		}
	}
}
