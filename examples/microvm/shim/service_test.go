package shim

import (
	"testing"

	cgroupstats "github.com/containerd/cgroups/stats/v1"
	"github.com/containerd/typeurl/v2"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// TestCgroupMetrics checks that the guest's measure reaches containerd as cgroups v1's Metrics, under the
// type URL containerd's CRI and ctr decode.
func TestCgroupMetrics(t *testing.T) {
	data, err := typeurl.MarshalAny(cgroupMetrics(&agentv1.ContainerStatsResponse{CpuUserNanos: 3e9, CpuSystemNanos: 1e9,
		MemoryRssBytes: 5 << 20, Processes: 2}))
	if err != nil {
		t.Fatal(err)
	}
	if got := data.GetTypeUrl(); got != "io.containerd.cgroups.v1.Metrics" {
		t.Fatalf("type URL %q", got)
	}
	v, err := typeurl.UnmarshalAny(data)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := v.(*cgroupstats.Metrics)
	if !ok {
		t.Fatalf("decoded as %T", v)
	}
	if m.CPU.Usage.Total != 4e9 || m.CPU.Usage.User != 3e9 || m.CPU.Usage.Kernel != 1e9 || m.Memory.Usage.Usage != 5<<20 ||
		m.Memory.RSS != 5<<20 || m.Pids.Current != 2 {
		t.Errorf("metrics = %+v", m)
	}
}
