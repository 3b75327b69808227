package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
)

const (
	// pmemImage is the size of the ext4 image each side of BenchmarkPmemDAX uses (a multiple of 2 MiB, as
	// persistent memory must be).
	pmemImage = 256 << 20
	// pmemReadMiB and pmemWriteMiB are the sizes of the files read and written, in MiB.
	pmemReadMiB, pmemWriteMiB = 64, 32
	// pmemSmallFiles is how many 4 KiB files the small-file workload creates.
	pmemSmallFiles = 500
)

// BenchmarkPmemDAX compares, in one guest (the cloud kernel crust-microvm boots), a persistent-memory
// volume as crust-microvm attaches it with the same volume attached as a virtio-blk disk, as crust attaches
// block and file volumes. The two sides are two copies of one ext4 image (4 KiB blocks, made on the host)
// in two files on the same host filesystem:
//
//   - dax: the file hot-plugged as virtio-pmem (vm.AttachPmem: a shared memory-backend-file, pmem=off as
//     the file is on a disk) and mounted by the guest agent with -o dax, so file data is read and written
//     in the mapped memory, with no guest page cache;
//   - blk: the file hot-plugged as virtio-blk (vm.AttachBlock: cache.direct=on, the host page cache
//     bypassed) and mounted by the guest agent as any disk, through the guest's page cache.
//
// Each op runs three workloads on each side, the order of the sides alternating between ops, timed on the
// host around the guest command as for BenchmarkGuestThroughput:
//
//   - read: a cold sequential read of a 64 MiB file (written and synced once before the ops) with dd
//     bs=1M to /dev/null, after dropping the guest's caches;
//   - write: a sequential write of a 32 MiB file with dd bs=1M conv=fsync (the previous one removed);
//   - create: 500 files of 4 KiB extracted from a tar in the guest's tmpfs, then sync (the previous ones
//     removed).
//
// Reported, from the total time of each kind of run: dax-read-MB/s, blk-read-MB/s, dax-write-MB/s,
// blk-write-MB/s, dax-create-files/s, blk-create-files/s, and for each workload the ratio dax/blk of the
// rates (how many times faster DAX is; below 1, slower). ns/op is suppressed: an op is six unlike runs.
//
// Under TCG every guest memory access is emulated, so DAX's gain, that a read or write is a copy
// straight between the user's buffer and the persistent memory instead of one into the page cache plus a
// request to a device, is damped: the copy itself is slow here, and virtio-blk's cost per request (a
// notification, QEMU's I/O, an interrupt) is small beside it. With KVM, guest memory accesses run at host
// speed: a DAX read is about a memcpy from the host's page cache (or from real persistent memory, with
// pmem=on), while every virtio-blk request still costs a VM exit, the host I/O and an injected interrupt,
// so the read and small-file ratios should grow well beyond what TCG shows. A synced write pays a host
// fsync of the backing on both sides (virtio-pmem turns a guest flush into one).
func BenchmarkPmemDAX(b *testing.B) {
	g := guest(b, "cloud")
	work := b.TempDir()
	seed := filepath.Join(work, "seed.img")
	makeImage(b, seed, pmemImage) // 4 KiB blocks: DAX needs blocks of a page
	daxFile, blkFile := filepath.Join(work, "dax.img"), filepath.Join(work, "blk.img")
	copyFile(b, seed, daxFile)
	copyFile(b, seed, blkFile)

	v := startVM(b, vm.Config{Kernel: g.kernel, Initramfs: g.initrd})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := v.AttachPmem(ctx, "dax", daxFile, false)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "dax", PmemAddress: p.Address, FsType: "ext4", Target: "/bench/dax"}); err != nil {
		b.Fatal(err)
	}
	if err := v.AttachBlock(ctx, "blk", blkFile, false); err != nil {
		b.Fatal(err)
	}
	if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "blk", FsType: "ext4", Target: "/bench/blk"}); err != nil {
		b.Fatal(err)
	}
	mounts := guestRun(b, v, "cat /proc/mounts")
	if l := mountLine(mounts, "/bench/dax"); !strings.Contains(l, "dax=always") {
		b.Fatalf("the pmem volume is not mounted with DAX: %q", l)
	}
	b.Logf("guest kernel %s (%s); dax: %s (host persistent memory: %t); blk: %s", v.Boot().Kernel, v.Boot().Accel,
		mountLine(mounts, "/bench/dax"), p.Persistent, mountLine(mounts, "/bench/blk"))

	// The file each side reads, and the small files' tar in the guest's tmpfs.
	for _, dir := range []string{"/bench/dax", "/bench/blk"} {
		guestRun(b, v, fmt.Sprintf("dd if=/dev/urandom of=%s/read bs=1M count=%d 2>/dev/null && sync", dir, pmemReadMiB))
	}
	guestRun(b, v, fmt.Sprintf("mkdir -p /tmp/small && cd /tmp/small && i=0 && while [ $i -lt %d ]; do "+
		"dd if=/dev/urandom of=f$i bs=4096 count=1 2>/dev/null; i=$((i+1)); done && tar -cf /tmp/small.tar -C /tmp/small .", pmemSmallFiles))

	type side struct {
		name, dir            string
		read, write, create  time.Duration
		reads, writes, makes []string // per op, for the log
	}
	sides := []*side{{name: "dax", dir: "/bench/dax"}, {name: "blk", dir: "/bench/blk"}}
	ops := 0
	for b.Loop() {
		b.StopTimer()
		order := takeTurns(sides, ops)
		for _, s := range order {
			guestRun(b, v, "sync && echo 3 > /proc/sys/vm/drop_caches")
			d := timed(b, v, fmt.Sprintf("dd if=%s/read of=/dev/null bs=1M 2>&1 | grep -q '^%d+0 records out'", s.dir, pmemReadMiB))
			s.read += d
			s.reads = append(s.reads, fmt.Sprintf("%.0f", mbps(pmemReadMiB<<20, d)))
		}
		for _, s := range order {
			guestRun(b, v, "rm -f "+s.dir+"/write && sync")
			d := timed(b, v, fmt.Sprintf("dd if=/dev/zero of=%s/write bs=1M count=%d conv=fsync 2>&1 | grep -q '^%d+0 records out'",
				s.dir, pmemWriteMiB, pmemWriteMiB))
			s.write += d
			s.writes = append(s.writes, fmt.Sprintf("%.0f", mbps(pmemWriteMiB<<20, d)))
		}
		for _, s := range order {
			guestRun(b, v, "rm -rf "+s.dir+"/small && mkdir "+s.dir+"/small && sync")
			d := timed(b, v, "tar -xf /tmp/small.tar -C "+s.dir+"/small && sync")
			s.create += d
			s.makes = append(s.makes, fmt.Sprintf("%.0f", pmemSmallFiles/d.Seconds()))
		}
		ops++
		b.StartTimer()
	}
	b.StopTimer()
	if ops == 0 {
		return
	}
	for _, s := range sides {
		b.Logf("%s by op: read MB/s %s; write MB/s %s; create files/s %s", s.name,
			strings.Join(s.reads, " "), strings.Join(s.writes, " "), strings.Join(s.makes, " "))
	}
	dax, blk := sides[0], sides[1]
	rate := func(n int64, d time.Duration) float64 { return float64(n) * float64(ops) / d.Seconds() }
	b.ReportMetric(0, "ns/op")
	for _, m := range []struct {
		name, unit string
		n          int64
		dax, blk   time.Duration
		scale      float64
	}{
		{"read", "MB/s", pmemReadMiB << 20, dax.read, blk.read, 1e6},
		{"write", "MB/s", pmemWriteMiB << 20, dax.write, blk.write, 1e6},
		{"create", "files/s", pmemSmallFiles, dax.create, blk.create, 1},
	} {
		d, k := rate(m.n, m.dax)/m.scale, rate(m.n, m.blk)/m.scale
		b.ReportMetric(d, "dax-"+m.name+"-"+m.unit)
		b.ReportMetric(k, "blk-"+m.name+"-"+m.unit)
		b.ReportMetric(d/k, m.name+"-dax/blk")
	}
}

// timed runs script with sh in v's guest and returns how long it took, seen from the host; it fails b
// unless the script exits 0.
func timed(b *testing.B, v *vm.VM, script string) time.Duration {
	b.Helper()
	t0 := time.Now()
	guestRun(b, v, script)
	return time.Since(t0)
}

// copyFile copies src to a new file dst.
func copyFile(b *testing.B, src, dst string) {
	b.Helper()
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		b.Fatal(err)
	}
	if err := out.Close(); err != nil {
		b.Fatal(err)
	}
}
