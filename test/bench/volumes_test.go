package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/benchfig"
)

const (
	// manyVolumes is how many volumes BenchmarkManyVolumes attaches to one guest, which has as many
	// hot-plug ports.
	manyVolumes = 32
	// manyVolumeSize is the size of each of its volumes: small, since what is measured is the attach and
	// the mount, not the data.
	manyVolumeSize = 16 << 20
	// fewPorts is the port count of the VM BenchmarkManyVolumes compares the boot of its guest with:
	// vm.Config's default.
	fewPorts = 8
)

// BenchmarkManyVolumes attaches manyVolumes (32) ext4 volumes, one after another, to one running guest
// (the cloud kernel, one vCPU, TCG) with as many hot-plug ports, and mounts each: vm.AttachBlock of a
// fresh loop device, then the agent's mount, as BenchmarkStageToMounted's bare path does. Each op boots
// its own VM and attaches, mounts, unmounts and detaches a first volume (untimed: the guest's first disk
// and first mount pay once for what no later one does), then times the attach and mount of every volume,
// checks that attaching one more fails with vm.ErrNoFreePort and an error naming the port count and that
// the guest lists every mount, and unmounts and detaches every volume and stops the VM (untimed).
//
// Recorded: vm/volume-32nd-vs-1st, the 32nd volume's attach+mount over the 1st's, one sample per op:
// whether a volume costs more when many are there already (its target, 1.5, allows the 32nd volume half
// as much again as the 1st, for what a guest with 31 more disks and mounts must do more; anything that
// reads every disk per mount, as the agent's search by serial did, misses it); vm/volume-attach-mount,
// each volume's time, every volume of every op; vm/volumes-attached, the volumes the guest had mounted
// at once; and what the ports cost the guest's boot: vm/boot-32-vs-8-ports, the boot (QEMU's start to
// the agent's answer) of the 32-port VM over that of a VM with the default 8, booted one after the other
// in each op, in alternating order.
func BenchmarkManyVolumes(b *testing.B) {
	g := guest(b, "cloud")
	work := b.TempDir()
	var first, last, each, bootRatio []float64
	var attached []float64
	ops := 0
	for b.Loop() {
		b.StopTimer()
		// The boots, the 8-port VM's only to compare with, one after the other.
		var many *vm.VM
		var boots [2]time.Duration // many ports, few
		for _, ports := range takeTurns([]int{manyVolumes, fewPorts}, ops) {
			v := startVM(b, vm.Config{Kernel: g.kernel, Initramfs: g.initrd, HotplugPorts: ports})
			if ports == manyVolumes {
				many, boots[0] = v, v.Boot().Took
				continue
			}
			boots[1] = v.Boot().Took
			stopVM(b, v)
		}
		bootRatio = append(bootRatio, float64(boots[0])/float64(boots[1]))

		loops := make([]loop, manyVolumes)
		for i := range loops {
			loops[i] = newLoop(b, work, manyVolumeSize)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		// A volume attached, mounted, unmounted and detached first, so that the 1st timed one does not pay
		// for what only the guest's first disk and mount do (probing the driver, the first ext4 mount).
		attachMount(ctx, b, many, "warm-up", loops[0].dev)
		unmountDetach(ctx, b, many, "warm-up")
		took, attach := make([]time.Duration, manyVolumes), make([]time.Duration, manyVolumes)
		b.StartTimer()
		for i, l := range loops {
			t0 := time.Now()
			attach[i] = attachMount(ctx, b, many, "vol-"+strconv.Itoa(i), l.dev)
			took[i] = time.Since(t0)
		}
		b.StopTimer()

		// One more than the ports: refused, and the error says where the limit is.
		err := many.AttachBlock(ctx, "vol-extra", loops[0].dev, false)
		if !errors.Is(err, vm.ErrNoFreePort) || !strings.Contains(err.Error(), strconv.Itoa(manyVolumes)) {
			b.Fatalf("attaching volume %d to a VM with %d ports: got %v, want vm.ErrNoFreePort naming %d", manyVolumes+1,
				manyVolumes, err, manyVolumes)
		}
		if ops == 0 {
			b.Logf("volume %d: %v", manyVolumes+1, err)
		}
		mounted := strings.Count(guestRun(b, many, "cat /proc/mounts"), " /bench/vol-")
		if mounted != manyVolumes {
			b.Fatalf("the guest has %d volumes mounted, want %d", mounted, manyVolumes)
		}
		attached = append(attached, float64(mounted))

		for i := range loops {
			unmountDetach(ctx, b, many, "vol-"+strconv.Itoa(i))
		}
		cancel()
		stopVM(b, many)
		for _, l := range loops {
			l.free(b)
		}

		first, last = append(first, ms(took[0])), append(last, ms(took[manyVolumes-1]))
		for _, d := range took {
			each = append(each, ms(d))
		}
		b.Logf("op %d: boot %v with %d ports, %v with %d; attach+mount ms by volume: %s; of which attach: %s", ops+1,
			boots[0].Round(time.Millisecond), manyVolumes, boots[1].Round(time.Millisecond), fewPorts, msList(took), msList(attach))
		ops++
		b.StartTimer()
	}
	b.StopTimer()
	if ops == 0 {
		return
	}
	ratios := make([]float64, ops)
	for i := range ratios {
		ratios[i] = last[i] / first[i]
	}
	benchfig.Record(b, benchfig.Figure{Name: "vm/volume-32nd-vs-1st", Unit: "x", Samples: ratios, Target: benchfig.AtMost(1.5),
		About: fmt.Sprintf("attach (QMP) + mount (the guest agent) of the %dth volume of one running guest over the 1st's, per op", manyVolumes)})
	benchfig.Record(b, benchfig.Figure{Name: "vm/volume-attach-mount", Unit: "ms", Samples: each,
		About: fmt.Sprintf("attach + mount of each of %d volumes of one guest, every volume of every op (TCG)", manyVolumes)})
	benchfig.Record(b, benchfig.Figure{Name: "vm/volumes-attached", Unit: "volumes", Samples: attached,
		About: fmt.Sprintf("volumes mounted at once in one guest with %d hot-plug ports; one more is refused (vm.ErrNoFreePort)", manyVolumes)})
	benchfig.Record(b, benchfig.Figure{Name: "vm/boot-32-vs-8-ports", Unit: "x", Samples: bootRatio,
		About: fmt.Sprintf("boot to the agent's answer of a guest with %d hot-plug ports over one with %d (TCG)", manyVolumes, fewPorts)})
	b.Logf("1st volume ms by op: %.0f; last: %.0f", first, last)
}

// attachMount attaches dev to v as disk id and mounts it on /bench/id in the guest, and returns how long
// the attach took.
func attachMount(ctx context.Context, b *testing.B, v *vm.VM, id, dev string) time.Duration {
	b.Helper()
	t0 := time.Now()
	if err := v.AttachBlock(ctx, id, dev, false); err != nil {
		b.Fatal(err)
	}
	attach := time.Since(t0)
	if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: id, FsType: "ext4", Target: "/bench/" + id}); err != nil {
		b.Fatalf("mounting %s: %v", id, err)
	}
	return attach
}

// unmountDetach undoes attachMount.
func unmountDetach(ctx context.Context, b *testing.B, v *vm.VM, id string) {
	b.Helper()
	if _, err := v.Agent().Unmount(ctx, &agentv1.UnmountRequest{Target: "/bench/" + id}); err != nil {
		b.Fatalf("unmounting %s: %v", id, err)
	}
	if err := v.DetachBlock(ctx, id); err != nil {
		b.Fatal(err)
	}
}

// stopVM stops v, failing b if it does not stop cleanly (startVM's cleanup stops it too, which is then a
// no-op).
func stopVM(b *testing.B, v *vm.VM) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := v.Stop(ctx); err != nil {
		b.Fatal(err)
	}
}
