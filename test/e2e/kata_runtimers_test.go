package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/critest"
	"crust.dev/crust/internal/testutil/harness"
)

// TestRuntimeRsSandboxFoundThroughCRI plays a node running Kata's runtime-rs, which never records its
// sandbox id in the volume's Kata directory: the real crustd asks a CRI runtime (a real gRPC server on a
// unix socket) for the pod's ready sandboxes and finds the one whose shim serves
// <shim dir>/<id>/shim-monitor.sock (a stand-in runtime-rs shim: stats on POST only). `crustctl stats`
// shows the shim's numbers, `crustctl get` the claim, cri_discovered (`ls` says so too), and `crustctl
// release --force` ends it. Once the shim is gone and the runtime lists the sandbox as not ready, crustd
// ends the claim by itself. With the runtime gone, stats of another such volume answer from the host,
// within the CRI timeout.
func TestRuntimeRsSandboxFoundThroughCRI(t *testing.T) {
	root := testutil.SocketDir(t)
	goDir, rsDir := filepath.Join(root, "sbs"), filepath.Join(root, "kata")
	cri := (&critest.Server{}).Start(t, filepath.Join(root, "cri.sock"))
	d := newDaemon(t, "--kata-shim-dirs", goDir+","+rsDir, "--cri-endpoint", cri.Endpoint(), "--cri-timeout", "500ms")

	const pod, sandbox = "0b6a3c1e-0000-4000-8000-00000000a11c", "5c1f0e7d9a2b4c3d"
	dev := loopDevice(t, 64<<20)
	target := d.podTarget(pod, "pvc-rs")
	d.crustctlOK("stage", "--target-path", target, "--device", dev, "--fs-type", "ext4")
	shim := (&katatest.Shim{StatsPostOnly: true, Stats: func(device string) (*katatest.VolumeStats, error) {
		if device != dev {
			return nil, os.ErrNotExist
		}
		return &katatest.VolumeStats{Usage: []katatest.VolumeUsage{
			{Available: 50 << 20, Total: 60 << 20, Used: 10 << 20, Unit: 1},
			{Available: 4000, Total: 4096, Used: 96, Unit: 2},
		}}, nil
	}}).Start(t, katatest.ShimSocket(rsDir, sandbox))
	cri.Set(critest.Sandbox(sandbox, pod, true), critest.Sandbox("an-older-one", pod, false))

	out, errOut, code := d.crustctl("stats", target, "-o", "json")
	var stats crustv1.GetVolumeStatsResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &stats) != nil {
		t.Fatalf("stats: exit %d: %s%s", code, out, errOut)
	}
	want := &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Available: 50 << 20, Total: 60 << 20, Used: 10 << 20, Unit: crustv1.VolumeUsage_UNIT_BYTES},
		{Available: 4000, Total: 4096, Used: 96, Unit: crustv1.VolumeUsage_UNIT_INODES},
	}}
	if !proto.Equal(&stats, want) {
		t.Fatalf("stats = %v, want the shim's %v", &stats, want)
	}
	if reqs := shim.Requests(); len(reqs) == 0 || reqs[len(reqs)-1].Method != "POST" {
		t.Fatalf("the shim got %+v, want stats by POST", reqs)
	}
	get := func() *crustv1.Volume {
		t.Helper()
		out, errOut, code := d.crustctl("get", target, "-o", "json")
		var v crustv1.Volume
		if code != 0 || protojson.Unmarshal([]byte(out), &v) != nil {
			t.Fatalf("get: exit %d: %s%s", code, out, errOut)
		}
		return &v
	}
	if c := get().GetClaim(); c.GetSandboxId() != sandbox || !c.GetKata() || !c.GetCriDiscovered() {
		t.Fatalf("claim %v, want %s, kata, cri_discovered", c, sandbox)
	}
	if out, _, _ := d.crustctl("ls"); !strings.Contains(out, sandbox+" (kata, found through CRI)") {
		t.Errorf("crustctl ls does not show the sandbox and how it was found:\n%s", out)
	}

	// crustctl release --force ends it (the runtime lists no sandbox meanwhile, so that nothing finds it
	// again at once); the next stats find it again.
	cri.Set()
	if _, errOut, code := d.crustctl("release", target, "--force"); code != 0 {
		t.Fatalf("release --force: exit %d: %s", code, errOut)
	}
	if c := get().GetClaim(); c != nil {
		t.Fatalf("claim after release --force: %v", c)
	}
	cri.Set(critest.Sandbox(sandbox, pod, true))
	if _, errOut, code := d.crustctl("stats", target); code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	if c := get().GetClaim(); c.GetSandboxId() != sandbox || !c.GetCriDiscovered() {
		t.Fatalf("claim after stats again: %v", c)
	}

	// The sandbox stops: its shim goes, and the runtime lists it as not ready. crustd ends the claim
	// within a few handler checks (one a second).
	shim.Close()
	cri.Set(critest.Sandbox(sandbox, pod, false))
	harness.Eventually(t, 15*time.Second, "the end of a stopped sandbox's claim", func() bool { return get().GetClaim() == nil })

	// The runtime gone: another volume, whose pod's shim is there, is answered from the host, within
	// about the CRI timeout; nothing is claimed.
	cri.Stop()
	target2 := d.podTarget("0b6a3c1e-0000-4000-8000-00000000a11d", "pvc-rs2")
	dev2 := loopDevice(t, 32<<20)
	d.crustctlOK("stage", "--target-path", target2, "--device", dev2, "--fs-type", "ext4")
	(&katatest.Shim{StatsPostOnly: true}).Start(t, katatest.ShimSocket(rsDir, "sandbox-2"))
	t0 := time.Now()
	out, errOut, code = d.crustctl("stats", target2, "-o", "json")
	if code != 0 || protojson.Unmarshal([]byte(out), &stats) != nil {
		t.Fatalf("stats with the runtime gone: exit %d: %s%s", code, out, errOut)
	}
	if took := time.Since(t0); took > 3*time.Second {
		t.Errorf("stats with the runtime gone took %s (CRI timeout 500ms)", took)
	}
	if u := stats.GetUsage(); len(u) != 1 || u[0].GetTotal() != 32<<20 || !strings.Contains(stats.GetVolumeCondition().GetMessage(), "not yet mounted") {
		t.Fatalf("stats with the runtime gone = %v, want the host's answer", &stats)
	}
}
