package csiproxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/internal/metrics"
)

// TestPruneQuarantine: targets quarantined past --quarantine-max-age are deleted, then the oldest while
// the rest hold more than --quarantine-max-bytes; a pod's directory left empty goes too, and the gauges
// say what is left against the bound. The newest targets, within both bounds, stay whole.
func TestPruneQuarantine(t *testing.T) {
	kubelet := t.TempDir()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	put := func(pod, vol string, age time.Duration, bytes int) string {
		dir := filepath.Join(kubelet, QuarantineDir, pod, quarantineName(vol, now.Add(-age)))
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sub", "data"), []byte(strings.Repeat("x", bytes)), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	ancient := put("pod-a", "vol-1", 30*24*time.Hour, 10)
	old := put("pod-b", "vol-2", 3*time.Hour, 600)
	newer := put("pod-b", "vol-3", 2*time.Hour, 300)
	newest := put("pod-c", "vol-4", time.Hour, 300)
	if err := os.Chmod(filepath.Join(kubelet, QuarantineDir), 0o700); err != nil {
		t.Fatal(err)
	}
	p := &Proxy{cfg: Config{KubeletDir: kubelet, QuarantineMaxAge: 7 * 24 * time.Hour, QuarantineMaxBytes: 1000},
		log: quietLog(), metrics: metrics.New()}
	if err := p.pruneQuarantine(now); err != nil {
		t.Fatal(err)
	}
	for dir, kept := range map[string]bool{ancient: false, old: false, newer: true, newest: true} {
		if _, err := os.Stat(dir); (err == nil) != kept {
			t.Errorf("%s: %v; want kept %t", dir, err, kept)
		}
	}
	if _, err := os.Stat(filepath.Join(kubelet, QuarantineDir, "pod-a")); !os.IsNotExist(err) {
		t.Errorf("the emptied pod directory: %v; want it gone", err)
	}
	for name, want := range map[string]float64{"crust_csi_proxy_quarantine_bytes": 600, "crust_csi_proxy_quarantine_limit_bytes": 1000,
		"crust_csi_proxy_quarantine_pruned_total": 2} {
		if got := metricValue(t, p, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
