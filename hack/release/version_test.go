package main

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository's root as seen from this package's directory, where go test runs.
const repoRoot = "../.."

// imageRef matches a reference to one of crust's own images with its tag: the tag is submatch 2.
var imageRef = regexp.MustCompile(`\bcrust/(crustd|crust-csi-proxy|crust-lvm-csi):([A-Za-z0-9._+-]+)`)

// newTagOfOurs matches a kustomize images entry for one of crust's images that sets newTag (submatch 1).
var newTagOfOurs = regexp.MustCompile(`name: \S*crust/(?:crustd|crust-csi-proxy|crust-lvm-csi)\n(?:\s+newName: \S+\n)?\s+newTag: (\S+)`)

// TestVersionAgrees holds every place that names crust's version to the file VERSION, so that a bump
// that misses one fails: the chart's version and appVersion, the tag of every reference to crust's
// images in deploy/, docs/ and the Go sources (a default image included), the chart label the Helm test
// expects, and the Makefile's VERSION.
func TestVersionAgrees(t *testing.T) {
	version, err := readVersion(repoRoot)
	if err != nil {
		t.Fatal(err)
	}

	chart := readFile(t, "deploy/helm/crust/Chart.yaml")
	for field, want := range map[string]string{"version": strings.TrimPrefix(version, "v"), "appVersion": version} {
		got := "missing"
		if m := regexp.MustCompile(`(?m)^` + field + `: *(\S+)$`).FindStringSubmatch(chart); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("deploy/helm/crust/Chart.yaml: %s is %s, want %s (VERSION)", field, got, want)
		}
	}
	if label := `"crust-` + strings.TrimPrefix(version, "v") + `"`; !strings.Contains(readFile(t, "deploy/helm/render_test.go"), label) {
		t.Errorf("deploy/helm/render_test.go: the helm.sh/chart label it expects is not %s (VERSION)", label)
	}

	// The manifests that must name the images, so that a file renamed or emptied does not pass unseen.
	mustName := map[string]bool{
		"deploy/crustd/daemonset.yaml": false, "deploy/csi-proxy/sidecar.yaml": false, "deploy/csi-proxy/controller.yaml": false,
		"deploy/examples/lvm-driver/node.yaml": false, "deploy/examples/lvm-driver/controller.yaml": false,
	}
	for _, path := range namingFiles(t) {
		text := readFile(t, path)
		for _, m := range imageRef.FindAllStringSubmatch(text, -1) {
			if m[2] != version {
				t.Errorf("%s: %s, want the tag %s (VERSION)", path, m[0], version)
			}
			if _, ok := mustName[path]; ok {
				mustName[path] = true
			}
		}
		for _, m := range newTagOfOurs.FindAllStringSubmatch(text, -1) {
			if m[1] != version {
				t.Errorf("%s: newTag %s for crust's image, want %s (VERSION)", path, m[1], version)
			}
		}
	}
	for path, named := range mustName {
		if !named {
			t.Errorf("%s names none of crust's images", path)
		}
	}

	cmd := exec.Command("make", "-s", "--no-print-directory", "-C", repoRoot, "version")
	cmd.Env = withoutMake(os.Environ())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make version: %v", err)
	}
	if first, _, _ := strings.Cut(string(out), "\n"); first != version {
		t.Errorf("make version prints %q first, want %s (VERSION)", first, version)
	}
}

// namingFiles are the files, relative to the repository's root, that may name crust's images: the
// manifests, chart and documents under deploy/ and docs/, the README, and the Go sources that are not
// tests (a test may name any tag it makes).
func namingFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "_output" || name == "testdata" || name == "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		docs := strings.HasPrefix(rel, "deploy/") || strings.HasPrefix(rel, "docs/") || rel == "README.md"
		switch {
		case docs && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".md") || strings.HasSuffix(name, ".tpl")),
			strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go"):
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// withoutMake is env without what a make running this test passes down, so that the Makefile's own
// default of VERSION is what is tested.
func withoutMake(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "VERSION", "BUILD_VERSION", "MAKEFLAGS", "MFLAGS", "MAKELEVEL":
			continue
		}
		out = append(out, kv)
	}
	return out
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")))
}
