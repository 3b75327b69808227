package e2e

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/testutil"
)

// TestKataShimBridge plays an unmodified Kata node: crustd projects a staged loop device, the test records
// a sandbox id in the projection as the Kata shim does when a container uses the volume, and a stand-in
// Kata shim serves the management socket at runtime-rs's place (crustd finds nothing at the Go runtime's
// first). `crustctl stats` then shows the shim's numbers, `crustctl expand` surfaces Kata's unimplemented
// resize as Unimplemented, and a shim gone is Unavailable.
func TestKataShimBridge(t *testing.T) {
	// Short, because a unix socket path must fit in 107 bytes.
	root := testutil.SocketDir(t)
	goDir, rsDir := filepath.Join(root, "sbs"), filepath.Join(root, "kata")
	shimDirs := goDir + "," + rsDir

	d := newDaemon(t, "--kata-shim-dirs", shimDirs)
	dev := loopDevice(t, 64<<20)
	target := d.podTarget("6f1c2d3e-0000-4000-8000-0000000000ca", "pvc-kata")
	if _, errOut, code := d.crustctl("stage", "--target-path", target, "--device", dev, "--fs-type", "ext4"); code != 0 {
		t.Fatalf("stage: exit %d: %s", code, errOut)
	}

	const sandbox = "8e7d9f3a1b2c4d5e"
	if err := katatest.RecordSandbox(d.kata, target, sandbox); err != nil {
		t.Fatal(err)
	}
	shim := (&katatest.Shim{Stats: func(device string) (*katatest.VolumeStats, error) {
		if device != dev {
			return nil, fmt.Errorf("no volume with device %s in this sandbox", device)
		}
		return &katatest.VolumeStats{Usage: []katatest.VolumeUsage{
			{Available: 1032192, Total: 1064960, Used: 32768, Unit: 1},
			{Available: 65525, Total: 65536, Unit: 2}, // used 0: left out on the wire
		}}, nil
	}}).Start(t, katatest.ShimSocket(rsDir, sandbox))

	// crustd shows the claim it read from the projection.
	out, errOut, code := d.crustctl("get", target, "-o", "json")
	var v crustv1.Volume
	if code != 0 || protojson.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("get: exit %d: %s%s", code, out, errOut)
	}
	if c := v.GetClaim(); c.GetSandboxId() != sandbox || !c.GetKata() {
		t.Fatalf("claim %v, want Kata sandbox %s", c, sandbox)
	}

	out, errOut, code = d.crustctl("stats", target, "-o", "json")
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	var stats crustv1.GetVolumeStatsResponse
	if err := protojson.Unmarshal([]byte(out), &stats); err != nil {
		t.Fatalf("stats -o json: %v\n%s", err, out)
	}
	want := &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Available: 1032192, Total: 1064960, Used: 32768, Unit: crustv1.VolumeUsage_UNIT_BYTES},
		{Available: 65525, Total: 65536, Used: 0, Unit: crustv1.VolumeUsage_UNIT_INODES},
	}}
	if !proto.Equal(&stats, want) {
		t.Fatalf("stats = %v, want %v", &stats, want)
	}
	reqs := shim.Requests()
	if len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Path != "/direct-volume/stats" ||
		reqs[0].RawQuery != "path="+url.PathEscape(dev) {
		t.Fatalf("the shim got %+v, want GET /direct-volume/stats?path=%s", reqs, url.PathEscape(dev))
	}

	// Offline, crustctl direct-volume stats asks the same shim and prints its JSON.
	out, errOut, code = d.crustctl("direct-volume", "stats", "--kata-dir", d.kata, "--volume-path", target, "--kata-shim-dirs", shimDirs)
	if wantOut := `{"usage":[{"available":1032192,"total":1064960,"used":32768,"unit":1},{"available":65525,"total":65536,"unit":2}]}`; code != 0 || strings.TrimSpace(out) != wantOut {
		t.Fatalf("direct-volume stats: exit %d: %q%s, want %s", code, out, errOut, wantOut)
	}

	// A real Kata answers every resize with the agent's UNIMPLEMENTED.
	_, errOut, code = d.crustctl("expand", target, "--size", "64M")
	if code != 1 || !strings.Contains(errOut, "crustctl: Unimplemented: ") || !strings.Contains(errOut, katatest.UnimplementedText) {
		t.Fatalf("expand: exit %d: %s", code, errOut)
	}
	reqs = shim.Requests()
	if wantBody := fmt.Sprintf(`{"VolumePath":%q,"Size":%d}`, dev, 64<<20); len(reqs) != 3 || reqs[2].Method != "POST" ||
		reqs[2].Path != "/direct-volume/resize" || string(reqs[2].Body) != wantBody {
		t.Fatalf("the shim got %+v, want POST /direct-volume/resize %s", reqs, wantBody)
	}

	// The shim gone: Unavailable, and the descriptor stays.
	shim.Close()
	_, errOut, code = d.crustctl("stats", target)
	if code != 1 || !strings.Contains(errOut, "crustctl: Unavailable: ") || !strings.Contains(errOut, sandbox) {
		t.Fatalf("stats with the shim gone: exit %d: %s", code, errOut)
	}
	if _, errOut, code := d.crustctl("get", target); code != 0 {
		t.Fatalf("get after a failed stats: exit %d: %s", code, errOut)
	}

	// Unstaging removes the projection with its sandbox id.
	if _, errOut, code := d.crustctl("unstage", "--target-path", target); code != 0 {
		t.Fatalf("unstage: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(d.kata, kata.VolumeDirName(target))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Kata volume dir still there after unstage: %v", err)
	}
}
