package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
)

const (
	// throughputImage is the size of each of the two ext4 filesystems BenchmarkGuestThroughput compares.
	throughputImage = 256 << 20
	// throughputFileMiB is the size of the file written and read on each, in MiB.
	throughputFileMiB = 128
	// shareTag is the 9p mount tag of the shared filesystem.
	shareTag = "bench9p"
	// ninepOptions are the 9p mount options in the guest.
	ninepOptions = "trans=virtio,version=9p2000.L"
)

// BenchmarkGuestThroughput compares, in one guest booted with the generic kernel (which has 9p), sequential
// I/O on two ext4 filesystems of the same size on loop devices of the same kind:
//
//   - direct: the device hot-plugged as a virtio-blk disk (vm.AttachBlock) and mounted by the guest agent,
//     as crust does;
//   - 9p: the filesystem mounted on the host and shared into the guest over virtio-9p-pci (vm.Share,
//     security_model=passthrough), mounted in the guest with -o trans=virtio,version=9p2000.L (the
//     kernel's defaults otherwise: msize 128 KiB, cache=none), as a runtime sharing a host mount does.
//
// Each op writes a 128 MiB file on each with busybox dd (from /dev/zero, bs=1M, conv=fsync, after removing
// the previous file), then drops the guest's caches and reads it back (to /dev/null, bs=1M); the order of
// the two paths alternates between ops. Times are taken on the host around each dd, the same way for both
// paths. The host's page cache is left alone: both paths read data the host has cached, so the figures
// compare the paths into the guest, not the host's disk. Two sub-benchmarks share the VM:
//
//   - buffered: dd as said, through the guest's page cache (for direct; 9p with cache=none has none);
//   - o_direct: the same with oflag=direct and iflag=direct, which takes the guest's page-cache copies out
//     of both paths and leaves the transports.
//
// Under TCG the guest's own CPU work (page-cache copies, ext4, the block layer) is emulated and slow, and
// the buffered direct path has more of it than 9p, whose large reads and writes go straight between the
// user's buffer and the host: the buffered figures weigh the emulation as much as the transports, while
// o_direct takes the guest's copies out of both.
//
// Reported by each, from the total bytes over the total time of each kind of run: direct-write-MB/s,
// 9p-write-MB/s, direct-read-MB/s, 9p-read-MB/s, and the ratios write-direct/9p and read-direct/9p (MB =
// 10^6 bytes). ns/op is suppressed: an op is four unlike runs.
func BenchmarkGuestThroughput(b *testing.B) {
	g := guest(b, "generic")
	work := b.TempDir()
	// Cleanups run last first: the VM (started below) stops before the host unmounts and frees.
	direct, shared := newLoop(b, work, throughputImage), newLoop(b, work, throughputImage)
	b.Cleanup(func() { direct.free(b) })
	b.Cleanup(func() { shared.free(b) })
	share := filepath.Join(work, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount(shared.dev, share, "ext4", 0, ""); err != nil {
		b.Fatalf("mounting %s on the host: %v", shared.dev, err)
	}
	b.Cleanup(func() {
		if err := unix.Unmount(share, 0); err != nil {
			b.Errorf("unmounting %s: %v", share, err)
		}
	})

	v := startVM(b, vm.Config{Kernel: g.kernel, Initramfs: g.initrd, Shares: []vm.Share{{Tag: shareTag, Path: share}}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := v.AttachBlock(ctx, "direct", direct.dev, false); err != nil {
		b.Fatal(err)
	}
	if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "direct", FsType: "ext4", Target: "/bench/direct"}); err != nil {
		b.Fatal(err)
	}
	guestRun(b, v, "mkdir -p /bench/9p && mount -t 9p -o "+ninepOptions+" "+shareTag+" /bench/9p")
	mounts := guestRun(b, v, "cat /proc/mounts")
	for _, want := range []string{" /bench/direct ext4 ", shareTag + " /bench/9p 9p "} {
		if !strings.Contains(mounts, want) {
			b.Fatalf("the guest's mounts lack %q:\n%s", want, mounts)
		}
	}
	about := fmt.Sprintf("guest kernel %s (%s); 9p mount: %s", v.Boot().Kernel, v.Boot().Accel, mountLine(mounts, "/bench/9p"))

	ran := false
	b.Run("buffered", func(b *testing.B) { ran = throughput(b, v, about, nil, nil) || ran })
	b.Run("o_direct", func(b *testing.B) {
		ran = throughput(b, v, about, []string{"oflag=direct"}, []string{"iflag=direct"}) || ran
	})

	// The 9p writes landed in the host's filesystem.
	if !ran {
		return
	}
	if fi, err := os.Stat(filepath.Join(share, "f")); err != nil || fi.Size() != throughputFileMiB<<20 {
		b.Fatalf("the file written over 9p is not on the host's filesystem in full: %v %v", fi, err)
	}
}

// throughput runs BenchmarkGuestThroughput's ops on v, with dd's extra arguments for writes and reads, and
// logs about first (a sub-benchmark's parent shows no log). It reports whether it ran any op.
func throughput(b *testing.B, v *vm.VM, about string, writeArgs, readArgs []string) bool {
	b.Logf("%s", about)
	type path struct {
		name, dir         string
		write, read       time.Duration
		writeOps, readOps []string // MB/s of each op, for the log
	}
	paths := []*path{{name: "direct", dir: "/bench/direct"}, {name: "9p", dir: "/bench/9p"}}
	file := func(p *path) string { return p.dir + "/f" }
	rate := func(d time.Duration) string { return fmt.Sprintf("%.0f", mbps(throughputFileMiB<<20, d)) }
	ops := 0
	for b.Loop() {
		b.StopTimer()
		order := takeTurns(paths, ops)
		for _, p := range order {
			guestRun(b, v, "rm -f "+file(p)+" && sync")
			d := guestDD(b, v, append([]string{"if=/dev/zero", "of=" + file(p), "conv=fsync"}, writeArgs...)...)
			p.write += d
			p.writeOps = append(p.writeOps, rate(d))
		}
		for _, p := range order {
			guestRun(b, v, "sync && echo 3 > /proc/sys/vm/drop_caches")
			d := guestDD(b, v, append([]string{"if=" + file(p), "of=/dev/null"}, readArgs...)...)
			p.read += d
			p.readOps = append(p.readOps, rate(d))
		}
		ops++
		b.StartTimer()
	}
	b.StopTimer()
	for _, p := range paths {
		b.Logf("%s MB/s by op: write %s; read %s", p.name, strings.Join(p.writeOps, " "), strings.Join(p.readOps, " "))
	}
	total := int64(ops) * throughputFileMiB << 20
	dw, dr := mbps(total, paths[0].write), mbps(total, paths[0].read)
	nw, nr := mbps(total, paths[1].write), mbps(total, paths[1].read)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(dw, "direct-write-MB/s")
	b.ReportMetric(nw, "9p-write-MB/s")
	b.ReportMetric(dw/nw, "write-direct/9p")
	b.ReportMetric(dr, "direct-read-MB/s")
	b.ReportMetric(nr, "9p-read-MB/s")
	b.ReportMetric(dr/nr, "read-direct/9p")
	return ops > 0
}

// guestRun runs script with sh in v's guest and returns its output, failing b unless it exits 0.
func guestRun(b *testing.B, v *vm.VM, script string) string {
	b.Helper()
	out, _ := guestExec(b, v, "sh", "-c", script)
	return out
}

// guestDD runs busybox dd with bs=1M and count=throughputFileMiB plus args in v's guest and returns how
// long it took, seen from the host. It fails b unless dd copied the whole file.
func guestDD(b *testing.B, v *vm.VM, args ...string) time.Duration {
	b.Helper()
	t0 := time.Now()
	_, errOut := guestExec(b, v, append([]string{"dd", "bs=1M", fmt.Sprintf("count=%d", throughputFileMiB)}, args...)...)
	d := time.Since(t0)
	if want := fmt.Sprintf("%d+0 records out", throughputFileMiB); !strings.Contains(errOut, want) {
		b.Fatalf("dd %s: copied less than %s: %s", strings.Join(args, " "), want, errOut)
	}
	return d
}

func guestExec(b *testing.B, v *vm.VM, argv ...string) (stdout, stderr string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	res, err := v.Agent().Exec(ctx, &agentv1.ExecRequest{Argv: argv, TimeoutMillis: (5 * time.Minute).Milliseconds()})
	if err != nil {
		b.Fatalf("exec %q: %v", argv, err)
	}
	if res.ExitStatus != 0 {
		b.Fatalf("exec %q: exit %d: %s%s", argv, res.ExitStatus, res.Stdout, res.Stderr)
	}
	return string(res.Stdout), string(res.Stderr)
}

// takeTurns returns a new slice of the two sides of a comparison: in their order for an even op, swapped
// for an odd one, so that neither side always runs first (after the other has warmed what they share).
func takeTurns[T any](sides []T, op int) []T {
	if op%2 == 1 {
		return []T{sides[1], sides[0]}
	}
	return []T{sides[0], sides[1]}
}

// mbps is n bytes over d in MB/s (10^6 bytes per second).
func mbps(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

// mountLine is the line of mounts (as /proc/mounts) for mount point dir.
func mountLine(mounts, dir string) string {
	for _, l := range strings.Split(mounts, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == dir {
			return l
		}
	}
	return ""
}
