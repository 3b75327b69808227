package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// conformanceSpecs are the External Storage specs CI runs (make test) on each filesystem: one or two of
// each kind of flow the example driver behind the proxy serves, each in a pod that boots its own guest
// (the node's default runtime is the microVM shim), a few seconds to a minute here. The two [Slow]
// specs (multiVolume's concurrent block access, volumeIO's file sizes) pass in VMs too but took minutes
// under TCG, so they run in `make conformance` (CRUST_CONFORMANCE=all), which runs every External
// Storage spec. CRUST_CONFORMANCE_FOCUS=REGEX runs the External Storage specs whose names match REGEX
// instead, to look into a few.
var conformanceSpecs = map[string][]string{
	"ext4": {
		"[Testpattern: Dynamic PV (default fs)] volumes should store data",
		"[Testpattern: Dynamic PV (default fs)] fsgroupchangepolicy (Always)[LinuxOnly], pod created with an initial fsgroup, new pod fsgroup applied to volume contents",
		"[Testpattern: Dynamic PV (default fs)] fsgroupchangepolicy (OnRootMismatch)[LinuxOnly], pod created with an initial fsgroup, volume contents ownership changed via chgrp in first pod, new pod with same fsgroup skips ownership changes to the volume contents",
		"[Testpattern: Dynamic PV (default fs)] subPath should be able to unmount after the subpath directory is deleted [LinuxOnly]",
		"[Testpattern: Dynamic PV (default fs)(allowExpansion)] volume-expand Verify if offline PVC expansion works",
		"[Testpattern: Dynamic PV (block volmode)] volumes should store data",
		"[Testpattern: Dynamic PV (ext4)] volumes should allow exec of files on the volume",
		"[Testpattern: CSI Ephemeral-volume (default fs)] ephemeral should create read/write inline ephemeral volume",
		"[Testpattern: Generic Ephemeral-volume (default fs) (late-binding)] ephemeral should support two pods which have the same volume definition",
	},
	"xfs": {
		"[Testpattern: Dynamic PV (default fs)] volumes should store data",
		"[Testpattern: Dynamic PV (default fs)(allowExpansion)] volume-expand should resize volume when PVC is edited while pod is using it",
	},
}

// oneWriterSkip are the specs skipped because one writer per device refuses what they do: two pods on the
// node that mount one filesystem volume, which are two kernels when each pod is a VM (the filesystem and
// default-fs patterns of multiVolume's concurrent access). The second pod's mount is refused with a
// VolumeHeldByAnotherPod Event naming the first pod, and the spec, which waits for both to run, times out.
// Its block pattern (a raw device shared by two VMs) is allowed and runs.
var oneWriterSkip = `\((default fs|filesystem volmode|ext4|xfs)\)\] multiVolume.* should concurrently access the single volume from pods on the same node`

// conformanceProcs is how many processes the suite runs on, CI's specs and `make conformance`'s alike:
// its specs spend most of their time waiting for pods and volumes, so three share the node's two cores
// (CI's specs took 1 min 45 s to 1 min 54 s on three, 3 min 51 s on one).
const conformanceProcs = 3

// TestExternalStorage runs Kubernetes' own storage e2e suite, e2e.test's External Storage tests (the way
// CSI drivers prove themselves), against the example driver behind crust-csi-proxy with the deferring
// StorageClass, once with ext4 and once with xfs. The suite's pods name no RuntimeClass, so they run with
// the node's default runtime, which is crust's microVM shim (hack/cluster/lib.sh, DEFAULT_RUNTIME): every
// pod runs in a guest, and the proxy (told the node's default by --default-runtime-handler) defers their
// volumes, which the shim mounts in the guest. e2e.test and the images it runs are built from the
// cluster's Kubernetes release (make test-images), and its image names are remapped to them
// (conformance/repo-list.yaml). The suite runs on conformanceProcs processes through ginkgo's command.
// Every failed spec fails the test with the suite's message; every skip is logged with the suite's
// reason.
func TestExternalStorage(t *testing.T) {
	c := get(t)
	e2e := filepath.Join(c.root, "_output", "k8s", "bin", "e2e.test")
	if _, err := os.Stat(e2e); err != nil {
		t.Fatalf("%v: make test-images builds it", err)
	}
	all := os.Getenv("CRUST_CONFORMANCE") == "all"
	ginkgo := filepath.Join(filepath.Dir(e2e), "ginkgo")
	if _, err := os.Stat(ginkgo); err != nil {
		t.Fatalf("%v: make test-images builds it", err)
	}
	for _, fs := range []string{"ext4", "xfs"} {
		t.Run(fs, func(t *testing.T) {
			focus := regexp.QuoteMeta("External Storage [Driver: " + driverName + "]")
			focused := os.Getenv("CRUST_CONFORMANCE_FOCUS")
			if focused != "" {
				focus += ".*(" + focused + ")"
			} else if !all {
				var quoted []string
				for _, s := range conformanceSpecs[fs] {
					quoted = append(quoted, regexp.QuoteMeta(s))
				}
				focus += ".*(" + strings.Join(quoted, "|") + ")"
			}
			dir := t.TempDir()
			driver := filepath.Join(dir, "driver.yaml")
			if err := writeDriverDefinition(driver, filepath.Join(c.root, "test", "cluster", "conformance"), fs); err != nil {
				t.Fatal(err)
			}
			timeout := 30 * time.Minute
			if all {
				timeout = 4 * time.Hour
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			report := filepath.Join(dir, "report.json")
			// The suite runs kubectl (kubectl exec) by the path given, else whatever kubectl PATH finds: the
			// one built with the cluster, not one the machine happens to have at another version.
			suiteArgs := []string{"--kubeconfig=" + c.kubeconfig, "--kubectl-path=" + c.kubectl, "--storage.testdriver=" + driver,
				"--kube-test-repo-list=" + filepath.Join(c.root, "test", "cluster", "conformance", "repo-list.yaml"), "--report-dir=" + dir}
			ginkgoArgs := []string{"--focus=" + focus, `--skip=\[Disruptive\]|\[Feature:|` + oneWriterSkip, "--no-color",
				"--timeout=" + timeout.String(), "--json-report=" + report}
			// On conformanceProcs processes through ginkgo's command (built with e2e.test), which runs the
			// suite's Serial specs alone once the others are done.
			cmd := exec.CommandContext(ctx, ginkgo,
				slices.Concat([]string{fmt.Sprintf("--procs=%d", conformanceProcs)}, ginkgoArgs, []string{e2e, "--"}, suiteArgs)...)
			cmd.Dir = dir
			log, err := os.Create(filepath.Join(dir, "e2e.log"))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = log.Close() }()
			cmd.Stdout, cmd.Stderr = log, log
			t0 := time.Now()
			runErr := cmd.Run()
			specs, err := readSpecReports(report)
			if err != nil {
				b, _ := os.ReadFile(log.Name())
				t.Fatalf("e2e.test: %v; its report: %v\n%s", runErr, err, tail(b, 4000))
			}
			counts, run := map[string]int{}, 0
			skips := map[string][]string{}
			for _, s := range specs {
				if s.State == "skipped" && s.Failure.Message == "" {
					continue // not selected: outside the focus, or a spec of another suite
				}
				counts[s.State]++
				run++
				switch s.State {
				case "passed":
				case "skipped":
					reason := firstLine(s.Failure.Message)
					skips[reason] = append(skips[reason], s.name())
				default:
					t.Errorf("%s: %s: %s", s.State, s.name(), s.Failure.Message)
				}
			}
			which := map[bool]string{true: "every spec", false: "CI's specs"}[all]
			if focused != "" {
				which = "the specs matching CRUST_CONFORMANCE_FOCUS"
			}
			t.Logf("External Storage on %s (%s): %d passed, %d failed, %d skipped, in %s", fs, which,
				counts["passed"], run-counts["passed"]-counts["skipped"], counts["skipped"], time.Since(t0).Round(time.Second))
			reasons := make([]string, 0, len(skips))
			for r := range skips {
				reasons = append(reasons, r)
			}
			slices.Sort(reasons)
			for _, r := range reasons {
				t.Logf("skipped %d: %s", len(skips[r]), r)
			}
			if !all && focused == "" && counts["passed"] != len(conformanceSpecs[fs]) {
				var missing []string
				for _, want := range conformanceSpecs[fs] {
					if !slices.ContainsFunc(specs, func(s specReport) bool { return s.State == "passed" && strings.Contains(s.name(), want) }) {
						missing = append(missing, want)
					}
				}
				t.Errorf("%d of CI's %d specs passed: no spec passed whose name has %q (the name no longer matches a spec, or the spec was skipped)",
					counts["passed"], len(conformanceSpecs[fs]), missing)
			}
			if runErr != nil && !t.Failed() {
				t.Errorf("e2e.test: %v", runErr)
			}
		})
	}
}

// writeDriverDefinition writes the External Storage suite's definition of the example driver for fs:
// the capabilities it really has behind the proxy (it publishes its storage capacity, and its volumes'
// topology), fs among its filesystem types, and deploy/examples' deferring StorageClass (for xfs,
// conformance/storageclass-xfs.yaml, the same class with xfs).
func writeDriverDefinition(path, dir, fs string) error {
	class := map[string]any{"FromExistingClassName": deferClass}
	minSize := "16Mi"
	if fs != "ext4" {
		class = map[string]any{"FromFile": filepath.Join(dir, "storageclass-"+fs+".yaml")}
		minSize = "320Mi" // mkfs.xfs refuses less than 300 MB
	}
	def := map[string]any{
		"StorageClass": class,
		"DriverInfo": map[string]any{
			"Name":               driverName,
			"SupportedSizeRange": map[string]string{"Min": minSize, "Max": "2Gi"},
			"SupportedFsType":    map[string]any{"": map[string]any{}, fs: map[string]any{}},
			"TopologyKeys":       []string{"topology.lvm.test.crust.dev/node"}, // the driver's TopologyKey
			"Capabilities": map[string]bool{
				"persistence": true, "block": true, "exec": true, "fsGroup": true, "multipods": true,
				"controllerExpansion": true, "nodeExpansion": true, "onlineExpansion": true, "offlineExpansion": true,
				"singleNodeVolume": true, "topology": true, "capacity": true,
			},
		},
		"ClaimSize":     minSize,
		"InlineVolumes": []map[string]any{{"Attributes": map[string]string{"size": minSize}}},
	}
	b, err := yaml.Marshal(def)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// specReport is what the test reads of one spec in ginkgo's JSON report.
type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	LeafNodeType            string
	State                   string
	Failure                 struct{ Message string }
}

func (s specReport) name() string {
	return strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " ")
}

// readSpecReports returns the It specs of ginkgo's JSON report at path.
func readSpecReports(path string) ([]specReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites []struct{ SpecReports []specReport }
	if err := json.Unmarshal(b, &suites); err != nil {
		return nil, &os.PathError{Op: "decode", Path: path, Err: err}
	}
	var specs []specReport
	for _, s := range suites {
		for _, r := range s.SpecReports {
			if r.LeafNodeType == "It" {
				specs = append(specs, r)
			}
		}
	}
	return specs, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
