package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
)

// TestRuntimeRsStatsThroughCRI proves stats through crust for a Kata sandbox that never wrote its id
// (Kata's runtime-rs, kata issue 13442). A pod of the kata RuntimeClass with a deferred PVC runs (runc
// stands in for Kata here); nothing writes a sandbox-id file into the volume's Kata directory. A stand-in
// runtime-rs shim (stats on POST only) serves /run/kata/<sandbox>/shim-monitor.sock in the node's
// /run, under the pod's real sandbox id as containerd's CRI reports it. crustd, asking containerd's
// real CRI socket, finds the sandbox and records it as the volume's claim (cri_discovered), and
// kubelet's stats summary for the PVC (NodeGetVolumeStats through crust-csi-proxy and crustd) carries
// the shim's numbers; the shim was asked about the device mountInfo.json names.
func TestRuntimeRsStatsThroughCRI(t *testing.T) {
	c := get(t)
	ns := c.namespace(t)
	c.pvc(t, ns, "data", "128Mi")
	pod := c.runPod(t, ns, podSpec("rs", kataClass, nil, claimVolume("data", "data")))
	uid := string(pod.UID)
	vols := c.podVolumes(t, uid)
	if len(vols) != 1 {
		t.Fatalf("crustd holds %d descriptors for pod %s, want 1", len(vols), uid)
	}
	target := vols[0].GetSpec().GetVolumeTargetPath()
	sandbox, _ := c.sandboxOf(t, uid)

	// The Kata directory of the volume: mountInfo.json and nothing else, no sandbox id.
	volDir := c.nsPath(filepath.Join(kata.DefaultDir, kata.VolumeDirName(target)))
	entries, err := os.ReadDir(volDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != kata.MountInfoFileName {
		t.Fatalf("the volume's Kata directory holds %v, want only %s", entries, kata.MountInfoFileName)
	}
	b, err := os.ReadFile(filepath.Join(volDir, kata.MountInfoFileName))
	if err != nil {
		t.Fatal(err)
	}
	var info kata.MountInfo
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}

	// The shim, at runtime-rs's place in the node's /run, reached through a descriptor of its directory:
	// /proc/<pid>/root/run/kata/<64 hex>/shim-monitor.sock is longer than a socket address may be.
	dir := c.nsPath(filepath.Join(kata.RustShimDir, sandbox))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	const total, used, inodes, inodesUsed = 130023424, 12345344, 32768, 77
	var mu sync.Mutex
	var asked []string
	shim := (&katatest.Shim{StatsPostOnly: true, Stats: func(device string) (*katatest.VolumeStats, error) {
		mu.Lock()
		asked = append(asked, device)
		mu.Unlock()
		if device != info.Device {
			return nil, fmt.Errorf("no volume with device %s in this sandbox", device)
		}
		return &katatest.VolumeStats{Usage: []katatest.VolumeUsage{
			{Total: total, Used: used, Available: total - used, Unit: 1},
			{Total: inodes, Used: inodesUsed, Available: inodes - inodesUsed, Unit: 2},
		}}, nil
	}}).Start(t, fmt.Sprintf("/proc/self/fd/%d/%s", fd, kata.ShimSocketName))
	t0 := time.Now()

	waitFor(t, 90*time.Second, "kubelet's stats of the PVC to be the shim's", func() (bool, error) {
		s, ok := c.kubeletVolumeStats(t, uid)["data"]
		if !ok {
			return false, fmt.Errorf("no stats for volume data")
		}
		if s.PVCRef == nil || s.PVCRef.Name != "data" {
			return false, fmt.Errorf("pvcRef %v", s.PVCRef)
		}
		return s.CapacityBytes == total && s.UsedBytes == used && s.AvailableBytes == total-used,
			fmt.Errorf("kubelet: capacity %d used %d available %d", s.CapacityBytes, s.UsedBytes, s.AvailableBytes)
	})
	t.Logf("the shim's numbers reached kubelet's stats summary %s after the shim started", time.Since(t0).Round(100*time.Millisecond))

	claim := c.podVolumes(t, uid)[0].GetClaim()
	if claim.GetSandboxId() != sandbox || !claim.GetKata() || !claim.GetCriDiscovered() {
		t.Fatalf("claim %v, want the pod's sandbox %s, kata, cri_discovered", claim, sandbox)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(asked, info.Device) {
		t.Errorf("the shim was asked about %q, want %s", asked, info.Device)
	}
	reqs := shim.Requests()
	if last := reqs[len(reqs)-1]; last.Method != "POST" || last.Path != katatest.StatsPath {
		t.Errorf("the shim's last request %+v, want POST %s", last, katatest.StatsPath)
	}
	if entries, _ := os.ReadDir(volDir); len(entries) != 1 {
		t.Errorf("the volume's Kata directory holds %v after discovery, want only %s", entries, kata.MountInfoFileName)
	}
}
