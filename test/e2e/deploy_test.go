package e2e

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestDeployManifestsMatchTheBinaries parses every manifest under deploy/ and checks that each crust
// container runs a binary this tree builds, with flags that binary has: a renamed flag must not leave the
// manifests behind.
func TestDeployManifestsMatchTheBinaries(t *testing.T) {
	files, err := filepath.Glob("../../deploy/*/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var obj struct {
				Kind string
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Name, Image string
								Args        []string
							}
						}
					}
				}
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, c := range obj.Spec.Template.Spec.Containers {
				bin := strings.SplitN(path.Base(c.Image), ":", 2)[0]
				out, err := exec.Command(filepath.Join(binDir, bin), "--help").CombinedOutput()
				if err != nil {
					t.Fatalf("%s: container %s runs %s, which this tree does not build: %v", f, c.Name, bin, err)
				}
				for _, a := range c.Args {
					flag, _, _ := strings.Cut(a, "=")
					if !strings.Contains(string(out), "  "+flag+" ") && !strings.Contains(string(out), ", "+flag+" ") {
						t.Errorf("%s: %s has no flag %s", f, bin, flag)
					}
				}
				checked++
			}
		}
	}
	if checked < 2 {
		t.Fatalf("checked %d containers, want crustd and crust-csi-proxy at least", checked)
	}
}
