package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/benchfig"
)

// mkfsSize is the size of the blank volumes BenchmarkMkfs formats.
const mkfsSize = 1 << 30

// guestMkfs is how crust-guest formats a blank ext4 volume (examples/microvm/guest's mkfs), less the
// device. The guest's mke2fs is the host's binary (the initramfs takes the host's tools).
var guestMkfs = []string{"mke2fs", "-q", "-F", "-t", "ext4", "-m", "0"}

// lazyInit asks mke2fs to leave the inode tables and the journal unzeroed (the kernel zeroes the inode
// tables in the background after the first mount).
var lazyInit = []string{"-E", "lazy_itable_init=1,lazy_journal_init=1"}

// BenchmarkMkfs measures what a fresh volume costs before its first mount: mke2fs of a blank 1 GiB
// device in a running guest (hot-plugged as crust attaches it, virtio-blk on a loop device with direct
// I/O) against the same mke2fs of the same kind of device on the host, with crust-guest's options and
// with lazy initialisation added. Each op formats four fresh devices, the guest's and the host's in turns
// (takeTurns); attaching, detaching and making the devices are not timed.
func BenchmarkMkfs(b *testing.B) {
	g := guest(b, "cloud")
	v := startVM(b, vm.Config{Kernel: g.kernel, Initramfs: g.initrd})
	work := b.TempDir()

	type side struct {
		name  string
		lazy  bool
		run   func(args []string) time.Duration
		times []time.Duration
	}
	disks := 0
	inGuest := func(args []string) time.Duration {
		id := fmt.Sprintf("mkfs%d", disks)
		disks++
		dev := blankLoop(b, work)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := v.AttachBlock(ctx, id, dev, false); err != nil {
			b.Fatal(err)
		}
		// The guest sees a hot-plugged disk a moment after QEMU has it: wait for it, as the agent does.
		gdev := strings.TrimSpace(guestRun(b, v, fmt.Sprintf(`for i in $(seq 600); do
			for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = %s ] && echo /dev/${d##*/} && exit 0; done
			sleep 0.1; done; echo "disk %s not in the guest after 60 s" >&2; exit 1`, id, id)))
		t0 := time.Now() // the agent runs argv itself: sh's mke2fs would be busybox's
		guestExec(b, v, append(slices.Clone(args), gdev)...)
		d := time.Since(t0)
		if err := v.DetachBlock(ctx, id); err != nil {
			b.Fatal(err)
		}
		return d
	}
	onHost := func(args []string) time.Duration {
		dev := blankLoop(b, work)
		t0 := time.Now()
		if out, err := exec.Command(args[0], append(args[1:], dev)...).CombinedOutput(); err != nil {
			b.Fatalf("%s on the host: %v: %s", strings.Join(args, " "), err, out)
		}
		return time.Since(t0)
	}
	sides := []*side{{name: "guest", run: inGuest}, {name: "host", run: onHost},
		{name: "guest-lazy", lazy: true, run: inGuest}, {name: "host-lazy", lazy: true, run: onHost}}
	op := 0
	for b.Loop() {
		b.StopTimer()
		for _, pair := range [][]*side{takeTurns(sides[:2], op), takeTurns(sides[2:], op)} {
			for _, s := range pair {
				args := guestMkfs
				if s.lazy {
					args = append(slices.Clone(guestMkfs), lazyInit...)
				}
				s.times = append(s.times, s.run(args))
			}
		}
		op++
		b.StartTimer()
	}
	b.StopTimer()
	if op == 0 {
		return
	}
	ratio := func(a, c *side) []float64 {
		r := make([]float64, len(a.times))
		for i := range a.times {
			r[i] = float64(a.times[i]) / float64(c.times[i])
		}
		return r
	}
	guestD, hostD, guestL, hostL := sides[0], sides[1], sides[2], sides[3]
	for _, s := range sides {
		b.Logf("mkfs %s, ms by op: %s", s.name, msList(s.times))
	}
	benchfig.Record(b, benchfig.Figure{Name: "vm/mkfs-guest", Unit: "ms", Samples: msEach(guestD.times),
		About: "mke2fs of a blank 1 GiB volume in the guest, with crust-guest's options"})
	benchfig.Record(b, benchfig.Figure{Name: "vm/mkfs-guest-vs-host", Unit: "x", Samples: ratio(guestD, hostD),
		About: "mke2fs of a blank 1 GiB volume in the guest / the same on the host, crust-guest's options"})
	benchfig.Record(b, benchfig.Figure{Name: "vm/mkfs-guest-lazy-vs-host-lazy", Unit: "x", Samples: ratio(guestL, hostL),
		About: "the same with lazy_itable_init and lazy_journal_init, guest / host"})
	benchfig.Record(b, benchfig.Figure{Name: "vm/mkfs-guest-lazy-vs-default", Unit: "x", Samples: ratio(guestL, guestD),
		About: "mke2fs in the guest with lazy initialisation / with crust-guest's options"})
	benchfig.Record(b, benchfig.Figure{Name: "vm/mkfs-host-lazy-vs-default", Unit: "x", Samples: ratio(hostL, hostD),
		About: "mke2fs on the host with lazy initialisation / with crust-guest's options"})
}

// blankLoop makes a sparse blank image file of mkfsSize bytes in dir and attaches it to a loop device
// with direct I/O, as crust's volumes are; both go at cleanup.
func blankLoop(b *testing.B, dir string) string {
	b.Helper()
	file := sparseFile(b, dir, "blank-*.img", mkfsSize)
	b.Cleanup(func() { _ = os.Remove(file) })
	return attachLoop(b, file, true)
}
