package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// crustImages are the images of deploy/ that this tree builds, with the binary each runs (its entrypoint).
var crustImages = map[string]string{
	"crust/crustd":          "crustd",
	"crust/crust-csi-proxy": "crust-csi-proxy",
	"crust/crust-lvm-csi":   "crust-lvm-csi", // examples/lvm-csi/cmd/crust-lvm-csi
}

// upstreamImages are the images of deploy/ that this tree does not build (the Kubernetes CSI sidecars);
// their flags are not checked here.
var upstreamImages = map[string]bool{
	"registry.k8s.io/sig-storage/csi-provisioner":           true,
	"registry.k8s.io/sig-storage/csi-resizer":               true,
	"registry.k8s.io/sig-storage/csi-node-driver-registrar": true,
}

// TestDeployManifestsMatchTheBinaries reads every Kubernetes object and strategic-merge patch under
// deploy/ (kustomization.yaml files and the Helm chart in deploy/helm aside) and checks each container:
// crust's images run a binary this tree builds, with flags that binary has (a renamed flag must not leave
// the manifests behind; a flag whose value is $(VAR) is checked by name), every $(VAR) in args or command
// is an env entry of the container, images carry a version tag and imagePullPolicy IfNotPresent, and any
// other image is one of upstreamImages. Workload objects are decoded strictly, so a misspelled field
// fails too.
func TestDeployManifestsMatchTheBinaries(t *testing.T) {
	const root = "../../deploy"
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == filepath.Join(root, "helm") {
			// The chart's templates are YAML only once rendered; deploy/helm's own test checks that they
			// render what this directory holds.
			return fs.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".yaml") && d.Name() != "kustomization.yaml" {
			files = append(files, p)
		}
		return nil
	})
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under %s: %v", root, err)
	}
	helps := map[string]map[string]bool{} // binary -> the flag spellings it accepts
	seen := map[string]int{}              // image name -> containers
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		for i, c := range containersIn(t, f, rel) {
			where := rel + ": container " + c.Name
			if c.Name == "" {
				t.Errorf("%s (#%d): container without a name", rel, i)
			}
			checkVars(t, where, c)
			if c.Image == "" {
				// A patch of a container defined elsewhere (env, say): nothing names the binary.
				if len(c.Args) > 0 || len(c.Command) > 0 {
					t.Errorf("%s: args or command without an image; cannot tell which binary they are for", where)
				}
				continue
			}
			name, tag := splitImage(c.Image)
			seen[name]++
			if tag == "" || tag == "latest" {
				t.Errorf("%s: image %s: want a version tag", where, c.Image)
			}
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("%s: imagePullPolicy %q, want IfNotPresent", where, c.ImagePullPolicy)
			}
			if upstreamImages[name] {
				continue
			}
			bin, ok := crustImages[name]
			if !ok {
				t.Errorf("%s: image %s is neither one this tree builds nor a listed upstream image", where, c.Image)
				continue
			}
			args := c.Args
			if len(c.Command) > 0 {
				if path.Base(c.Command[0]) != bin {
					t.Errorf("%s: command %s, but image %s runs %s", where, c.Command[0], name, bin)
				}
				args = append(append([]string{}, c.Command[1:]...), c.Args...)
			}
			if helps[bin] == nil {
				helps[bin] = flagsOf(t, bin)
			}
			for _, flag := range flagNames(args) {
				if !helps[bin][flag] {
					t.Errorf("%s: %s has no flag %s", where, bin, flag)
				}
			}
		}
	}
	for name := range crustImages {
		if seen[name] == 0 {
			t.Errorf("no container runs %s; want crustd, crust-csi-proxy and the example driver checked", name)
		}
	}
	for name := range upstreamImages {
		if seen[name] == 0 {
			t.Errorf("upstream image %s is listed but no manifest uses it: remove it from upstreamImages", name)
		}
	}
}

// workloads has, for each kind of object that holds a pod spec, a function that returns a new empty
// object of that kind (to decode a document into) and its pod spec.
var workloads = map[string]func() (any, *corev1.PodSpec){
	"DaemonSet":   func() (any, *corev1.PodSpec) { o := &appsv1.DaemonSet{}; return o, &o.Spec.Template.Spec },
	"Deployment":  func() (any, *corev1.PodSpec) { o := &appsv1.Deployment{}; return o, &o.Spec.Template.Spec },
	"StatefulSet": func() (any, *corev1.PodSpec) { o := &appsv1.StatefulSet{}; return o, &o.Spec.Template.Spec },
	"Job":         func() (any, *corev1.PodSpec) { o := &batchv1.Job{}; return o, &o.Spec.Template.Spec },
	"Pod":         func() (any, *corev1.PodSpec) { o := &corev1.Pod{}; return o, &o.Spec },
}

// containersIn returns the containers and init containers of every workload object (or patch of one)
// in file; other objects have none. name is the file's name in messages.
func containersIn(t *testing.T, file, name string) []corev1.Container {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Container
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		workload, ok := workloads[head.Kind]
		if !ok {
			continue
		}
		obj, spec := workload()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Errorf("%s: %s: %v", name, head.Kind, err)
			if err := yaml.Unmarshal(doc, obj); err != nil { // check its containers all the same
				continue
			}
		}
		out = append(out, spec.InitContainers...)
		out = append(out, spec.Containers...)
	}
	return out
}

// splitImage splits an image reference into name and tag ("" when it has none; a digest counts as
// none).
func splitImage(image string) (name, tag string) {
	name, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		return name[:i], name[i+1:]
	}
	return name, ""
}

// varRef is a $(VAR) reference as Kubernetes expands it in command and args; $$ escapes one.
var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkVars fails for a $(VAR) in c's command or args that c's env does not define: Kubernetes leaves
// such a reference as it is, and the program gets the literal text.
func checkVars(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e.Name] = true
	}
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if m[1] != "" && !env[m[1]] {
				t.Errorf("%s: %q uses $(%s), which the container's env does not define", where, a, m[1])
			}
		}
	}
}

// flagNames returns the flag of each argument that is one ("--name=value" gives "--name"); arguments
// that do not start with "-" are values of the flag before them, and "--" ends the flags.
func flagNames(args []string) []string {
	var out []string
	for _, a := range args {
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		out = append(out, name)
	}
	return out
}

// helpLine matches a flag in --help output: pflag's "  -h, --help" and "      --name type", and the
// standard library's "  -name type".
var helpLine = regexp.MustCompile(`(?m)^\s+(?:-([A-Za-z0-9]), )?(--?)([A-Za-z0-9][A-Za-z0-9._-]*)`)

// flagsOf runs bin --help from binDir and returns the spellings it accepts: "--name" (and "-x" for a
// shorthand) for pflag, "-name" and "--name" for the standard library's flag package.
func flagsOf(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, bin), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v (is it built into binDir?)\n%s", bin, err, out)
	}
	flags := map[string]bool{}
	for _, m := range helpLine.FindAllStringSubmatch(string(out), -1) {
		if m[2] == "--" {
			flags["--"+m[3]] = true
			if m[1] != "" {
				flags["-"+m[1]] = true
			}
		} else {
			flags["-"+m[3]] = true
			flags["--"+m[3]] = true
		}
	}
	if len(flags) < 2 {
		t.Fatalf("%s --help lists no flags:\n%s", bin, out)
	}
	names := make([]string, 0, len(flags))
	for f := range flags {
		names = append(names, f)
	}
	sort.Strings(names)
	t.Logf("%s accepts %s", bin, strings.Join(names, " "))
	return flags
}
