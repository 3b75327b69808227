// Package csisanity runs csi-sanity (kubernetes-csi/csi-test, pinned in tools/csisanity) against crust's
// reference CSI driver on a real LVM volume group on a loop device, once with mount volumes, once with
// raw block volumes, and once with mount volumes deferred to a real crustd (crust.dev/defer: "true" in the
// volume parameters) and no sandbox ever claiming them: stats and expansion are answered before any
// claim. It needs root (make test runs it as root) and lvm2; other users skip it.
//
// The test fails on any csi-sanity failure and on any skip not listed in justifiedSkips, so that a skip
// appears only with its reason.
package csisanity

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/volume"
	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
	"crust.dev/crust/internal/testutil/harness"

	"crust.dev/crust/test/csisanity/sanityrun"
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
	"ListVolumes not supported":                                 "LIST_VOLUMES not advertised: the reference driver does not list volumes",
	"GetCapacity not supported":                                 "GET_CAPACITY not advertised: no storage capacity tracking",
	"Snapshot not supported":                                    "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	"CreateSnapshot not supported":                              "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	"DeleteSnapshot not supported":                              "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	"ListSnapshots not supported":                               "LIST_SNAPSHOTS not advertised: no snapshots",
	"Volume Cloning not supported":                              "CLONE_VOLUME not advertised: no volumes made from volumes",
	"Modify volume not supported":                               "MODIFY_VOLUME not advertised: no mutable parameters",
	"Modify Volume not supported":                               "MODIFY_VOLUME not advertised: no mutable parameters",
	"ControllerModifyVolume not supported":                      "MODIFY_VOLUME not advertised: no mutable parameters",
	"ControllerPublishVolume not supported":                     "PUBLISH_UNPUBLISH_VOLUME not advertised: local volumes are not attached",
	"ControllerUnpublishVolume not supported":                   "PUBLISH_UNPUBLISH_VOLUME not advertised: local volumes are not attached",
	"Controller Publish, UnpublishVolume not supported":         "PUBLISH_UNPUBLISH_VOLUME not advertised; the Node suite runs the lifecycle",
	"GroupControllerService not supported":                      "no GroupController service: no volume group snapshots",
	"VolumeGroupSnapshots not supported":                        "no GroupController service: no volume group snapshots",
	"testnodevolumeattachlimit not enabled":                     "the driver reports no attach limit (max_volumes_per_node 0)",
	"Service does not have single node multi writer capability": "SINGLE_NODE_MULTI_WRITER not advertised by the Node service",
	"NodeGetVolumeHealth not supported":                         "the alpha volume-health RPCs are not advertised by the reference driver",
	"NodeGetStorageHealth not supported":                        "the alpha storage-health RPC is not advertised by the reference driver",
	"ControllerListVolumeHealth not supported":                  "the alpha volume-health RPCs are not advertised by the reference driver",
	"ControllerGetVolumeHealth not supported":                   "the alpha volume-health RPCs are not advertised by the reference driver",
	"GetSnapshot not supported":                                 "CREATE_DELETE_SNAPSHOT not advertised: no snapshots",
	sanityrun.Pending:                                           "marked pending (XIt) in csi-sanity itself; it would need LIST_VOLUMES anyway",
}

func TestCSISanity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: LVM on a loop device, mounts")
	}
	root, err := harness.FindModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// Build csi-sanity first, so that the build does not count in its run time; `go tool` caches it.
	if err := sanityrun.Build(root); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"mount", "block", "deferred"} {
		t.Run(mode, func(t *testing.T) { runSanity(t, root, mode) })
	}
}

func runSanity(t *testing.T, root, mode string) {
	vg := lvmtest.New(t, vgSize)
	dir := t.TempDir()
	endpoint := filepath.Join(dir, "csi.sock")
	logFile, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	access, pathsDir, params := mode, dir, ""
	var crust *realCrustd
	if mode == "deferred" {
		// Target and staging paths under crustd's kubelet root, as kubelet's are.
		access, pathsDir, params = "mount", filepath.Join(dir, "kubelet"), filepath.Join(dir, "params.yaml")
		if err := os.WriteFile(params, []byte(volume.DeferKey+`: "true"`+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		crust = startCrustd(t, dir, pathsDir)
	}
	cfg := lvmdriver.Config{
		VG: vg.Name, Devices: []string{vg.Device}, NodeID: "sanity-node", StateDir: filepath.Join(dir, "state"),
		Log: slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if crust != nil {
		cfg.CrustSocket = crust.socket
	}
	stop, err := lvmdriver.Start(endpoint, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()

	report, err := sanityrun.Run(sanityrun.Config{
		ModuleRoot:     root,
		Endpoint:       endpoint,
		StagingDir:     filepath.Join(pathsDir, "staging"),
		MountDir:       filepath.Join(pathsDir, "mount"),
		VolumeSize:     volumeSize,
		ExpandSize:     expandSize,
		AccessType:     access,
		ParametersFile: params,
		JUnit:          filepath.Join(dir, "junit.xml"),
	})
	if report == nil {
		t.Fatal(err)
	}
	out, runErr, elapsed := report.Output, report.RunErr, report.Elapsed

	stopped = true
	if err := stop(); err != nil {
		t.Errorf("driver stop: %v", err)
	}
	if left, err := vg.LVs(); err != nil || len(left) > 0 {
		t.Errorf("volumes left in the volume group after csi-sanity: %v (%v)", left, err)
	}

	if err != nil {
		t.Fatalf("csi-sanity: %v (run: %v)\n%s", err, runErr, sanityrun.Tail(out, 60))
	}
	passed, failed, skipped := sanityrun.Split(report.Results)
	t.Logf("csi-sanity %s: %d passed, %d failed, %d skipped in %s", mode, len(passed), len(failed), len(skipped), elapsed.Round(time.Second))
	if crust != nil {
		crust.check(t)
	}
	for _, s := range skipped {
		reason := ""
		for msg, why := range justifiedSkips {
			if strings.HasSuffix(strings.TrimSpace(s.Message), "- "+msg) || strings.TrimSpace(s.Message) == msg {
				reason = why
				break
			}
		}
		if reason == "" {
			t.Errorf("unjustified skip: %s (%s)", s.Name, s.Message)
		} else {
			t.Logf("skipped (%s): %s", reason, strings.TrimPrefix(s.Name, "[It] "))
		}
	}
	for _, f := range failed {
		t.Errorf("failed: %s\n%s", f.Name, f.Message)
	}
	if runErr != nil && len(failed) == 0 {
		t.Errorf("csi-sanity exited with %v and no failed test:\n%s", runErr, sanityrun.Tail(out, 60))
	}
	if len(passed) == 0 {
		t.Errorf("csi-sanity passed no test:\n%s", sanityrun.Tail(out, 60))
	}
	if t.Failed() {
		b, _ := os.ReadFile(logFile.Name())
		t.Logf("driver log (tail):\n%s", sanityrun.Tail(b, 80))
	}
}
