package helm

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
