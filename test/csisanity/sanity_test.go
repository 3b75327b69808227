// Package csisanity runs csi-sanity (kubernetes-csi/csi-test, pinned in tools/csisanity) against crust's
// reference CSI driver on a real LVM volume group on a loop device, once with mount volumes and once with
// raw block volumes. It needs root (make test runs it as root) and lvm2; other users skip it.
//
// The test fails on any csi-sanity failure and on any skip not listed in justifiedSkips, so that a skip
// appears only with its reason.
package csisanity

import (
	"encoding/xml"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/test/csidriver"
	"crust.dev/crust/test/csidriver/lvmtest"
)

// Sizes: whole 4 MiB extents, so that the capacities the driver returns are the ones csi-sanity asks for.
const (
	volumeSize = 64 << 20
	expandSize = 128 << 20
	vgSize     = 8 << 30 // sparse; only what is written takes space
)

// justifiedSkips maps csi-sanity's reason for a skip to why the skip is right: each names a capability the
// driver does not advertise. The Controller suite's "volume lifecycle" tests need
// PUBLISH_UNPUBLISH_VOLUME; the Node suite's "should work" and "should be idempotent" run the same
// lifecycle without it, and they pass.
var justifiedSkips = map[string]string{
	"ListVolumes not supported":                         "LIST_VOLUMES not advertised: the reference driver does not list volumes",
	"GetCapacity not supported":                         "GET_CAPACITY not advertised: no storage capacity tracking",
	"Snapshot not supported":                            "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	"CreateSnapshot not supported":                      "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	"DeleteSnapshot not supported":                      "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	"ListSnapshots not supported":                       "LIST_SNAPSHOTS not advertised: no snapshots",
	"Volume Cloning not supported":                      "CLONE_VOLUME not advertised: no volumes made from volumes",
	"Modify volume not supported":                       "MODIFY_VOLUME not advertised: no mutable parameters",
	"Modify Volume not supported":                       "MODIFY_VOLUME not advertised: no mutable parameters",
	"ControllerModifyVolume not supported":              "MODIFY_VOLUME not advertised: no mutable parameters",
	"ControllerPublishVolume not supported":             "PUBLISH_UNPUBLISH_VOLUME not advertised: local volumes are not attached",
	"ControllerUnpublishVolume not supported":           "PUBLISH_UNPUBLISH_VOLUME not advertised: local volumes are not attached",
	"Controller Publish, UnpublishVolume not supported": "PUBLISH_UNPUBLISH_VOLUME not advertised; the Node suite runs the lifecycle",
	"GroupControllerService not supported":              "no GroupController service: no volume group snapshots",
	"VolumeGroupSnapshots not supported":                "no GroupController service: no volume group snapshots",
	"testnodevolumeattachlimit not enabled":             "the driver reports no attach limit (max_volumes_per_node 0)",
	pending:                                             "marked pending (XIt) in csi-sanity itself; it would need LIST_VOLUMES anyway",
}

// pending is the message readJUnit gives a spec csi-sanity marks pending.
const pending = "pending in csi-sanity"

func TestCSISanity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: LVM on a loop device, mounts")
	}
	root := moduleRoot(t)
	// Build csi-sanity first, so that the build does not count in its run time; `go tool` caches it.
	build := exec.Command("go", "tool", "-modfile="+filepath.Join(root, "tools", "csisanity", "go.mod"), "csi-sanity", "-h")
	build.Dir = root
	if out, _ := build.CombinedOutput(); !strings.Contains(string(out), "csi.endpoint") {
		t.Fatalf("build csi-sanity:\n%s", out)
	}
	for _, access := range []string{"mount", "block"} {
		t.Run(access, func(t *testing.T) { runSanity(t, root, access) })
	}
}

func runSanity(t *testing.T, root, access string) {
	vg := lvmtest.New(t, vgSize)
	dir := t.TempDir()
	endpoint := filepath.Join(dir, "csi.sock")
	logFile, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	stop, err := csidriver.Start(endpoint, csidriver.Config{
		VG: vg.Name, Devices: []string{vg.Device}, NodeID: "sanity-node", StateDir: filepath.Join(dir, "state"),
		Log: slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	junit := filepath.Join(dir, "junit.xml")
	start := time.Now()
	cmd := exec.Command("go", "tool", "-modfile="+filepath.Join(root, "tools", "csisanity", "go.mod"), "csi-sanity",
		"--csi.endpoint", "unix://"+endpoint,
		"--csi.stagingdir", filepath.Join(dir, "staging"),
		"--csi.mountdir", filepath.Join(dir, "mount"),
		"--csi.testvolumesize", strconv.Itoa(volumeSize),
		"--csi.testvolumeexpandsize", strconv.Itoa(expandSize),
		"--csi.testvolumeaccesstype", access,
		"--ginkgo.junit-report", junit,
		"--ginkgo.no-color",
		"--ginkgo.timeout", "20m",
	)
	cmd.Dir = root
	out, runErr := cmd.CombinedOutput()
	elapsed := time.Since(start)

	stopped = true
	if err := stop(); err != nil {
		t.Errorf("driver stop: %v", err)
	}
	if left, err := vg.LVs(); err != nil || len(left) > 0 {
		t.Errorf("volumes left in the volume group after csi-sanity: %v (%v)", left, err)
	}

	passed, failed, skipped, err := readJUnit(junit)
	if err != nil {
		t.Fatalf("csi-sanity: %v (run: %v)\n%s", err, runErr, tail(out, 60))
	}
	t.Logf("csi-sanity %s: %d passed, %d failed, %d skipped in %s", access, len(passed), len(failed), len(skipped), elapsed.Round(time.Second))
	for _, s := range skipped {
		reason := ""
		for msg, why := range justifiedSkips {
			if strings.HasSuffix(strings.TrimSpace(s.message), "- "+msg) || strings.TrimSpace(s.message) == msg {
				reason = why
				break
			}
		}
		if reason == "" {
			t.Errorf("unjustified skip: %s (%s)", s.name, s.message)
		} else {
			t.Logf("skipped (%s): %s", reason, strings.TrimPrefix(s.name, "[It] "))
		}
	}
	for _, f := range failed {
		t.Errorf("failed: %s\n%s", f.name, f.message)
	}
	if runErr != nil && len(failed) == 0 {
		t.Errorf("csi-sanity exited with %v and no failed test:\n%s", runErr, tail(out, 60))
	}
	if len(passed) == 0 {
		t.Errorf("csi-sanity passed no test:\n%s", tail(out, 60))
	}
	if t.Failed() {
		b, _ := os.ReadFile(logFile.Name())
		t.Logf("driver log (tail):\n%s", tail(b, 80))
	}
}

type result struct{ name, message string }

// readJUnit reads ginkgo's JUnit report: the spec test cases (not the suite's set-up and tear-down) as
// passed, failed (with the failure) and skipped (with the reason).
func readJUnit(path string) (passed, failed, skipped []result, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, err
	}
	var suites struct {
		Suites []struct {
			Cases []struct {
				Name    string `xml:"name,attr"`
				Status  string `xml:"status,attr"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
				Error *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"error"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &suites); err != nil {
		return nil, nil, nil, fmt.Errorf("parse %s: %w", path, err)
	}
	for _, s := range suites.Suites {
		for _, c := range s.Cases {
			if strings.HasPrefix(c.Name, "[BeforeSuite]") || strings.HasPrefix(c.Name, "[AfterSuite]") ||
				strings.HasPrefix(c.Name, "[SynchronizedBeforeSuite]") || strings.HasPrefix(c.Name, "[SynchronizedAfterSuite]") {
				if c.Failure != nil || c.Error != nil {
					failed = append(failed, result{c.Name, "suite set-up or tear-down failed"})
				}
				continue
			}
			switch {
			case c.Failure != nil:
				failed = append(failed, result{c.Name, c.Failure.Message + "\n" + c.Failure.Text})
			case c.Error != nil:
				failed = append(failed, result{c.Name, c.Error.Message + "\n" + c.Error.Text})
			case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
				msg := pending
				if c.Skipped != nil && c.Status != "pending" {
					msg = c.Skipped.Message
				}
				skipped = append(skipped, result{c.Name, msg})
			default:
				passed = append(passed, result{c.Name, ""})
			}
		}
	}
	return passed, failed, skipped, nil
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func tail(b []byte, lines int) string {
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
