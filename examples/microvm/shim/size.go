package shim

import (
	"fmt"
	"runtime"
	"strconv"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// The annotations containerd's CRI puts on a sandbox's spec with the pod's resources as kubelet gives
// them (the sum of its containers' limits; 0 or absent when they set none).
const (
	annotationSandboxMemory    = "io.kubernetes.cri.sandbox-memory"
	annotationSandboxCPUQuota  = "io.kubernetes.cri.sandbox-cpu-quota"
	annotationSandboxCPUPeriod = "io.kubernetes.cri.sandbox-cpu-period"
)

// defaultMemoryMB is the guest's own memory when CRUST_MICROVM_MEMORY_MB sets none.
const defaultMemoryMB = 512

// vmSize is the sandbox VM's memory and vCPUs: the guest's own (Settings.MemoryMB, one vCPU) plus what
// the pod's containers are limited to, so that their limits fit in the guest as they would on the node.
// A pod without limits gets the guest's own alone. vCPUs never exceed the node's CPUs.
func vmSize(set Settings, spec *specs.Spec) (memoryMB, cpus int, err error) {
	memoryMB, cpus = set.MemoryMB, 1
	if memoryMB == 0 {
		memoryMB = defaultMemoryMB
	}
	num := func(key string) (int64, error) {
		v, ok := spec.Annotations[key]
		if !ok || v == "" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("annotation %s=%q: not a count", key, v)
		}
		return n, nil
	}
	mem, err := num(annotationSandboxMemory)
	if err != nil {
		return 0, 0, err
	}
	memoryMB += int((mem + 1<<20 - 1) >> 20)
	quota, err := num(annotationSandboxCPUQuota)
	if err != nil {
		return 0, 0, err
	}
	period, err := num(annotationSandboxCPUPeriod)
	if err != nil {
		return 0, 0, err
	}
	if quota > 0 && period > 0 {
		cpus += int((quota + period - 1) / period)
	}
	return memoryMB, min(cpus, runtime.NumCPU()), nil
}
