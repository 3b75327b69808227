package shim

import (
	"runtime"
	"strings"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

func TestVMSize(t *testing.T) {
	for _, c := range []struct {
		name        string
		set         Settings
		annotations map[string]string
		mem, cpus   int
		err         string
	}{
		{name: "no limits", mem: 512, cpus: 1},
		{name: "limits of zero", annotations: map[string]string{annotationSandboxMemory: "0", annotationSandboxCPUQuota: "0", annotationSandboxCPUPeriod: "100000"}, mem: 512, cpus: 1},
		{name: "memory limit, rounded up to MiB", annotations: map[string]string{annotationSandboxMemory: "134217729"}, mem: 512 + 129, cpus: 1},
		{name: "the guest's own memory set", set: Settings{MemoryMB: 256}, annotations: map[string]string{annotationSandboxMemory: "67108864"}, mem: 256 + 64, cpus: 1},
		{name: "half a CPU", annotations: map[string]string{annotationSandboxCPUQuota: "50000", annotationSandboxCPUPeriod: "100000"}, mem: 512, cpus: min(2, runtime.NumCPU())},
		{name: "many CPUs, bounded by the node's", annotations: map[string]string{annotationSandboxCPUQuota: "6400000", annotationSandboxCPUPeriod: "100000"}, mem: 512, cpus: runtime.NumCPU()},
		{name: "bad memory", annotations: map[string]string{annotationSandboxMemory: "lots"}, err: annotationSandboxMemory},
		{name: "negative quota", annotations: map[string]string{annotationSandboxCPUQuota: "-1"}, err: annotationSandboxCPUQuota},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, cpus, err := vmSize(c.set, &specs.Spec{Annotations: c.annotations})
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one naming %s", err, c.err)
				}
				return
			}
			if err != nil || mem != c.mem || cpus != c.cpus {
				t.Fatalf("vmSize = %d MiB, %d vCPUs, %v; want %d, %d", mem, cpus, err, c.mem, c.cpus)
			}
		})
	}
}
