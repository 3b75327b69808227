package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/initramfs"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/benchfig"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/test/bench/dataload"
)

// The data-path benchmark's sizes, chosen so that `make bench` (BENCH_OPS rounds) stays within its time
// under TCG; each figure is one sample per round.
const (
	// dpImage is the size of each ext4 filesystem.
	dpImage = 256 << 20
	// dpFiles is how many 4 KiB files the small-file workloads create, stat and read.
	dpFiles = 120
	// dpSeqMiB is the size of the sequential workloads' file, in MiB.
	dpSeqMiB = 8
	// dpFioMiB is the size of fio's file, in MiB, and dpFioRuntime how long each fio job runs.
	dpFioMiB, dpFioRuntime = 32, "500ms"
	// dpTx is how many SQLite transactions each SQLite workload commits.
	dpTx = 20
	// dpProgram is where the workload program is in the guest.
	dpProgram = "/usr/bin/dataload"
)

// kata9pOptions are the options Kata Containers mounts a 9p share with (its runtime's sharedDir9pOptions,
// "trans=virtio,version=9p2000.L,cache=mmap" and "nodev", with msize from DEFMSIZE9P := 8192). cache=mmap
// is also what lets SQLite's WAL map its shared-memory file: with cache=none, 9p refuses shared mappings.
const kata9pOptions = "trans=virtio,version=9p2000.L,cache=mmap,nodev,msize=8192"

// kataVirtioFSArgs are the virtiofsd arguments Kata Containers runs its shared file system with by default
// (Kata's src/runtime/Makefile and src/runtime-rs/Makefile, at the time of writing: DEFVIRTIOFSCACHE ?=
// auto, DEFVIRTIOFSEXTRAARGS ?= ["--thread-pool-size=1", "-o", "announce_submounts"], the C virtiofsd's
// spelling, which Debian's is; DEFVIRTIOFSCACHESIZE ?= 0, no DAX window; virtio_fs_queue_size 1024, as
// vm.FSShare's device has). The cache mode is given by kataVirtioFSCache.
var kataVirtioFSArgs = []string{"--thread-pool-size=1", "-o", "announce_submounts"}

// kataVirtioFSCache is Kata's default virtio-fs cache mode (virtio_fs_cache = "auto", see
// kataVirtioFSArgs): metadata and data cached in the guest for a short timeout, files opened without
// FOPEN_DIRECT_IO.
const kataVirtioFSCache = "auto"

// dpPath is one place a workload runs: a guest mount, the guest's tmpfs or the host.
type dpPath struct {
	name string
	dir  string // the directory the workloads use
	host bool   // runs on the host, not in the guest
}

// BenchmarkDataPath compares, in one guest booted with the generic kernel (which has 9p and virtio-fs),
// the same data on a volume attached as crust attaches it with the same filesystem shared into the guest
// as microVM runtimes share a host mount today:
//
//   - blk: an ext4 image on a loop device (direct I/O to its file) hot-plugged as a virtio-blk disk
//     (vm.AttachBlock, cache.direct=on) and mounted by the guest agent, as crust-microvm does: the host's
//     page cache is not in the path;
//   - blk-hostcache: a copy of the image on a buffered loop device, attached the same way but through the
//     host's page cache (vm.WithHostCache), for comparing with the shares on equal terms;
//   - virtiofs: a third copy mounted on the host and shared over virtio-fs as Kata shares it by default
//     (virtiofsd cache=auto, Kata's default arguments; see kataVirtioFSArgs) and mounted with
//     mount -t virtiofs;
//   - 9p: the same host directory shared over virtio-9p (vm.Share) and mounted as Kata mounts it (see
//     kata9pOptions: cache=mmap, msize 8 KiB).
//
// The workloads run in the guest from one static program, dataload (test/bench/dataload), which times
// itself, so the agent's exec is not in the figures:
//
//   - small files: create (dpFiles files of 4 KiB, each written and fsynced), then stat of the cold tree
//     (every entry lstat'ed) and read of the cold tree (every file read), after dropping caches;
//   - sequential: a dpSeqMiB MiB file written in 1 MiB writes then fsynced, buffered and O_DIRECT, and read
//     back cold, buffered and O_DIRECT;
//   - random 4 KiB reads and writes at queue depth 1 and 32: fio (libaio, O_DIRECT, dpFioRuntime a job
//     on a dpFioMiB MiB file, the four jobs one after the other in one fio process), copied from the host
//     with its libraries into the guest's initramfs. Without fio on the host (Debian package fio) these
//     figures are skipped, saying so;
//   - SQLite: dpTx transactions, each inserting one row and committing (synchronous=FULL), in WAL and in
//     rollback-journal (delete) mode, with modernc.org/sqlite.
//
// The host's page cache is compared like with like, both ways. Without it: blk never uses it, and before
// each cold read on the shares the host's caches are dropped (sync; echo 3 > /proc/sys/vm/drop_caches,
// the whole host's), so they read from the disk below as blk does; the figures are named plainly
// ("-blk-vs-virtiofs"). With it: blk-hostcache against the shares with the host's caches warm, only the
// guest's dropped ("-hostcache"). The writes of small files, sequential files and SQLite are measured
// once a round on the four paths (a synced write reaches the disk on each; the shares' ratio with the
// host's cache is blk-hostcache's over the same share sample). fio's four jobs run in one process after
// the drop, so the later jobs find in the host's cache what the earlier ones read (at most a few MiB of
// the file). fio's and the sequential O_DIRECT runs bypass the guest's page cache; on the shares
// virtiofsd (no allow_direct_io, Kata's default) and QEMU's 9p server still go through the host's.
//
// Ceilings, to show where TCG bounds a figure: the same program on the host, on the ext4 the shares
// export (its page cache warm: an upper bound), and in the guest on a tmpfs (no device at all: what the
// emulated CPU alone allows). O_DIRECT runs have no tmpfs ceiling (the 6.1 guest's tmpfs refuses it).
//
// Each op is a round of every workload on every path, the paths' order rotating from round to round.
// Every figure is recorded with benchfig, one sample per round: the ratios blk/virtiofs and blk/9p of
// each workload's rate (and blk-hostcache/virtiofs with the host's cache), with the target of at least 5×
// virtio-fs on small files, random reads and SQLite commits; for those workloads the ratios of the two
// ceilings to virtio-fs ("-host-vs-virtiofs", "-guest-tmpfs-vs-virtiofs"), about the most any guest path
// could reach against virtio-fs on this host's storage and under this emulation; and the rates of every path and ceiling
// as measured. ns/op is suppressed.
//
// Under TCG every guest instruction is emulated: the guest's filesystem, block layer and page-cache
// copies cost tens of times what they do natively, while the host's side of each path (QEMU's block
// backend, virtiofsd, the 9p server) runs at host speed. That favours the shares, whose work is mostly on
// the host (ext4 runs there), over blk, whose ext4 runs in the emulated guest: the tmpfs ceiling shows
// how much of a figure is the emulated CPU. Creates with fsync and SQLite commits carry every flush out
// of the emulated guest to the host's storage and back on every path (a guest fsync ends as one on the
// host, whichever way it goes): the host ceiling shows what that storage allows. With KVM the guest's own work
// runs at native speed and each path costs its exits: one or a few per virtio-blk request, against a FUSE
// round trip per metadata operation on virtio-fs (lookups, getattr, create, fsync each go to virtiofsd
// and back) and a 9P message per 8 KiB on 9p; the cold-tree and random-read ratios should grow, the
// synced ones stay bound by the flush unless the storage acknowledges flushes at once, and sequential
// throughput of every path rise towards the device's (docs/performance.md, "Data path", has the figures).
func BenchmarkDataPath(b *testing.B) {
	needVMs(b)
	virtiofsd, err := vm.FindVirtioFSD()
	if err != nil {
		b.Skipf("skipping: %v", err)
	}
	g, load, fio, fioErr := dataloadGuest(b, "generic")

	work := b.TempDir()
	seed := filepath.Join(work, "seed.img")
	makeImage(b, seed, dpImage)
	images := map[string]string{}
	for _, n := range []string{"blk", "blkc", "share"} {
		images[n] = filepath.Join(work, n+".img")
		copyFile(b, seed, images[n])
	}
	// Cleanups run last first: the VM (started below) stops before the host unmounts and frees.
	blkDev := attachLoop(b, images["blk"], true)
	blkcDev := attachLoop(b, images["blkc"], false)
	shareDev := attachLoop(b, images["share"], false)
	share := filepath.Join(work, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount(shareDev, share, "ext4", 0, ""); err != nil {
		b.Fatalf("mounting %s on the host: %v", shareDev, err)
	}
	b.Cleanup(func() {
		if err := unix.Unmount(share, 0); err != nil {
			b.Errorf("unmounting %s: %v", share, err)
		}
	})
	for _, d := range []string{"virtiofs", "9p", "host"} {
		if err := os.Mkdir(filepath.Join(share, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}

	v := startVM(b, vm.Config{
		Kernel: g.kernel, Initramfs: g.initrd, MemoryMB: 768, VirtioFSD: virtiofsd,
		Shares:   []vm.Share{{Tag: shareTag, Path: share}},
		FSShares: []vm.FSShare{{Tag: "benchvfs", Path: share, Cache: kataVirtioFSCache, DaemonArgs: kataVirtioFSArgs}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := v.AttachBlock(ctx, "blk", blkDev, false); err != nil {
		b.Fatal(err)
	}
	if err := v.AttachBlock(ctx, "blkc", blkcDev, false, vm.WithHostCache()); err != nil {
		b.Fatal(err)
	}
	for _, id := range []string{"blk", "blkc"} {
		if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: id, FsType: "ext4", Target: "/bench/" + id}); err != nil {
			b.Fatal(err)
		}
	}
	guestRun(b, v, "mkdir -p /bench/virtiofs /bench/9p /bench/tmpfs && mount -t virtiofs benchvfs /bench/virtiofs && "+
		"mount -t 9p -o "+kata9pOptions+" "+shareTag+" /bench/9p && mount -t tmpfs -o size=192m tmpfs /bench/tmpfs")
	mounts := guestRun(b, v, "cat /proc/mounts")
	for _, want := range []string{" /bench/blk ext4 ", " /bench/blkc ext4 ", "benchvfs /bench/virtiofs virtiofs ", shareTag + " /bench/9p 9p "} {
		if !strings.Contains(mounts, want) {
			b.Fatalf("the guest's mounts lack %q:\n%s", want, mounts)
		}
	}
	b.Logf("guest kernel %s (%s); virtiofsd %s %s; 9p: %s; fio: %s", v.Boot().Kernel, v.Boot().Accel, virtiofsd,
		strings.Join(append([]string{"-o", "cache=" + kataVirtioFSCache}, kataVirtioFSArgs...), " "),
		mountLine(mounts, "/bench/9p"), fioState(fio, fioErr))

	var (
		blk      = &dpPath{name: "blk", dir: "/bench/blk"}
		blkc     = &dpPath{name: "blk-hostcache", dir: "/bench/blkc"}
		virtiofs = &dpPath{name: "virtiofs", dir: "/bench/virtiofs/virtiofs"}
		ninep    = &dpPath{name: "9p", dir: "/bench/9p/9p"}
		tmpfs    = &dpPath{name: "guest-tmpfs", dir: "/bench/tmpfs"}
		host     = &dpPath{name: "host", dir: filepath.Join(share, "host"), host: true}
	)
	r := &dpRun{b: b, v: v, prog: load}
	writers := []*dpPath{blk, blkc, virtiofs, ninep}
	if fioErr == nil {
		// fio's files, laid out once (fio would otherwise write them at its first run).
		for _, p := range append(slices.Clone(writers), tmpfs, host) {
			r.load(p, "write", "-file", p.dir+"/fio", "-mib", strconv.Itoa(dpFioMiB))
		}
	}

	if r.rounds(func(round int) {
		ws := rotate(writers, round)
		cold := rotate([]*dpPath{blk, virtiofs, ninep}, round)
		warm := rotate([]*dpPath{blkc, virtiofs, ninep}, round)
		ceilings := []*dpPath{tmpfs, host}

		// Small files.
		for _, p := range slices.Concat(ws, ceilings) {
			r.shell(p, "rm -rf "+p.dir+"/tree")
			r.rate(p, "smallfile-create", "files/s", r.load(p, "create", "-dir", p.dir+"/tree", "-n", strconv.Itoa(dpFiles)).Rate())
		}
		for _, w := range []string{"stat", "read"} {
			unit := map[string]string{"stat": "entries/s", "read": "files/s"}[w]
			r.coldWarm(cold, warm, ceilings, func(p *dpPath, keep func(string, string, float64)) {
				keep("smallfile-"+w, unit, r.load(p, w, "-dir", p.dir+"/tree").Rate())
			})
		}

		// Sequential, buffered and O_DIRECT.
		for _, d := range []struct{ suffix, flag string }{{"buffered", ""}, {"direct", "-direct"}} {
			ps := slices.Concat(ws, []*dpPath{host})
			if d.flag == "" {
				ps = append(ps, tmpfs)
			}
			for _, p := range ps {
				args := []string{"write", "-file", p.dir + "/seq", "-mib", strconv.Itoa(dpSeqMiB)}
				if d.flag != "" {
					args = append(args, d.flag)
				}
				r.rate(p, "seq-write-"+d.suffix, "MB/s", r.load(p, args...).Rate()/1e6)
			}
			var ceil []*dpPath
			if d.flag == "" {
				ceil = ceilings
			} else {
				ceil = []*dpPath{host}
			}
			r.coldWarm(cold, warm, ceil, func(p *dpPath, keep func(string, string, float64)) {
				args := []string{"seqread", "-file", p.dir + "/seq"}
				if d.flag != "" {
					args = append(args, d.flag)
				}
				keep("seq-read-"+d.suffix, "MB/s", r.load(p, args...).Rate()/1e6)
			})
		}

		// Random 4 KiB I/O with fio.
		if fioErr == nil {
			r.coldWarm(cold, warm, ceilings, r.fio)
		}

		r.sqlite(slices.Concat(ws, ceilings))
	}) == 0 {
		return
	}
	if fioErr != nil {
		b.Logf("random 4 KiB I/O not measured: %v (Debian package fio; make deps installs it)", fioErr)
	}
	r.record(blk, blkc, virtiofs, ninep, tmpfs, host)

	// What the shares wrote is on the host's filesystem.
	for _, d := range []string{"virtiofs", "9p"} {
		n, err := os.ReadDir(filepath.Join(share, d, "tree", "d000"))
		if err != nil || len(n) != min(dpFiles, 100) {
			b.Fatalf("the small files written over %s are not on the host's filesystem: %d files, %v", d, len(n), err)
		}
	}
}

// dataloadGuest returns the guest of flavour with the workload program (at dpProgram) and, when the
// host has it, fio with its libraries; load is the program on the host, fioErr why there is no fio.
func dataloadGuest(b *testing.B, flavour string) (g guestImages, load, fio string, fioErr error) {
	b.Helper()
	load = program(b, "crust.dev/crust/test/bench/cmd/dataload")
	files := []initramfs.File{{Name: dpProgram, Source: load, Mode: 0o755}}
	fio, fioErr = exec.LookPath("fio")
	label := "dataload"
	if fioErr == nil {
		fioFiles, err := initramfs.Executable(fio)
		if err != nil {
			b.Fatal(err)
		}
		files = append(files, fioFiles...)
		label += "-fio"
	}
	return guestWith(b, flavour, label, files), load, fio, fioErr
}

// fioState says which fio the guest has, or why none.
func fioState(fio string, err error) string {
	if err != nil {
		return "none (" + err.Error() + "; Debian package fio)"
	}
	out, _ := exec.Command(fio, "--version").Output()
	return fio + " " + strings.TrimSpace(string(out))
}

// rotate returns a copy of ps rotated left by round, so that each path in turn goes first.
func rotate[T any](ps []T, round int) []T {
	k := round % len(ps)
	return append(slices.Clone(ps[k:]), ps[:k]...)
}

// dpRun runs BenchmarkDataPath's workloads and gathers the samples of its figures.
type dpRun struct {
	b    *testing.B
	v    *vm.VM
	prog string // the workload program on the host
	// samples by workload and path, one a round
	rates map[string]map[string][]float64
	units map[string]string
	order []string // workloads in the order first measured
}

// load runs the workload program with args on p and returns its result.
func (r *dpRun) load(p *dpPath, args ...string) dataload.Result {
	r.b.Helper()
	var out string
	if p.host {
		o, err := exec.Command(r.prog, args...).Output()
		if err != nil {
			r.b.Fatalf("dataload %s on the host: %v: %s", strings.Join(args, " "), err, stderrOf(err))
		}
		out = string(o)
	} else {
		out, _ = guestExec(r.b, r.v, append([]string{dpProgram}, args...)...)
	}
	var res dataload.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Seconds <= 0 {
		r.b.Fatalf("dataload %s on %s: bad result %q: %v", strings.Join(args, " "), p.name, out, err)
	}
	return res
}

// stderrOf is the standard error a failed exec.Cmd.Output kept, if any.
func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

// shell runs script with sh on p.
func (r *dpRun) shell(p *dpPath, script string) {
	r.b.Helper()
	if p.host {
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			r.b.Fatalf("%s on the host: %v: %s", script, err, out)
		}
		return
	}
	guestRun(r.b, r.v, script)
}

// dropCaches writes back and drops the guest's page, dentry and inode caches, and the host's too when
// host is set.
func (r *dpRun) dropCaches(host bool) {
	r.b.Helper()
	guestRun(r.b, r.v, "sync && echo 3 > /proc/sys/vm/drop_caches")
	if host {
		unix.Sync()
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
			r.b.Fatalf("dropping the host's caches: %v", err)
		}
	}
}

// coldWarm measures read workloads: run on each of cold with the guest's and the host's caches dropped
// before, on each of warm with the guest's only, and on the ceilings as they are. run gives each
// workload's rate to keep; the shares measured warm are kept under "<path>-hostcache".
func (r *dpRun) coldWarm(cold, warm, ceilings []*dpPath, run func(p *dpPath, keep func(workload, unit string, v float64))) {
	r.b.Helper()
	keeper := func(p *dpPath) func(string, string, float64) {
		return func(w, unit string, v float64) { r.rate(p, w, unit, v) }
	}
	for _, p := range cold {
		r.dropCaches(true)
		run(p, keeper(p))
	}
	for _, p := range warm {
		r.dropCaches(false)
		name := p.name
		if !strings.HasSuffix(name, "-hostcache") {
			name += "-hostcache"
		}
		run(p, keeper(&dpPath{name: name}))
	}
	for _, p := range ceilings {
		run(p, keeper(p))
	}
}

// rounds runs each once a benchmark op (b.Loop), with the timer stopped, logging how long each took, and
// returns how many ran; when any did, ns/op is suppressed, the figures being recorded on their own.
func (r *dpRun) rounds(each func(round int)) int {
	round := 0
	for r.b.Loop() {
		r.b.StopTimer()
		t0 := time.Now()
		each(round)
		round++
		r.b.Logf("round %d took %s", round, time.Since(t0).Round(time.Second))
		r.b.StartTimer()
	}
	r.b.StopTimer()
	if round > 0 {
		r.b.ReportMetric(0, "ns/op")
	}
	return round
}

// sqlite keeps the rate of dpTx SQLite commits on each of ps, in WAL and then in rollback-journal mode.
func (r *dpRun) sqlite(ps []*dpPath) {
	r.b.Helper()
	for _, j := range []string{"wal", "delete"} {
		for _, p := range ps {
			r.rate(p, "sqlite-"+j, "tx/s", r.load(p, "sqlite", "-db", p.dir+"/db", "-journal", j, "-tx", strconv.Itoa(dpTx)).Rate())
		}
	}
}

// rate keeps a sample of workload on p.
func (r *dpRun) rate(p *dpPath, workload, unit string, v float64) {
	if r.rates == nil {
		r.rates, r.units = map[string]map[string][]float64{}, map[string]string{}
	}
	if r.rates[workload] == nil {
		r.rates[workload] = map[string][]float64{}
		r.units[workload] = unit
		r.order = append(r.order, workload)
	}
	r.rates[workload][p.name] = append(r.rates[workload][p.name], v)
}

// dpFioJobs are the fio jobs each fio run does, one after the other: 4 KiB random reads and writes at
// queue depth 1 and 32.
var dpFioJobs = []fioJob{{"rand-read-qd1", "randread", 1}, {"rand-read-qd32", "randread", 32}, {"rand-write-qd1", "randwrite", 1}, {"rand-write-qd32", "randwrite", 32}}

// fio runs dpFioJobs with fio (libaio, O_DIRECT but on tmpfs, dpFioRuntime each) on p's fio file, one
// process, and keeps each job's IOPS.
func (r *dpRun) fio(p *dpPath, keep func(workload, unit string, v float64)) {
	r.b.Helper()
	direct := 1
	if p.name == "guest-tmpfs" {
		direct = 0 // tmpfs has no O_DIRECT in the 6.1 guest
	}
	args := fioArgs(p.dir+"/fio", direct, dpFioJobs)
	var out string
	if p.host {
		o, err := exec.Command("fio", args...).Output()
		if err != nil {
			r.b.Fatalf("fio %s on the host: %v: %s", strings.Join(args, " "), err, stderrOf(err))
		}
		out = string(o)
	} else {
		bin, _ := exec.LookPath("fio")
		out, _ = guestExec(r.b, r.v, append([]string{bin}, args...)...)
	}
	iops, err := fioIOPS(out, dpFioJobs)
	if err != nil {
		r.b.Fatalf("fio on %s: %v", p.name, err)
	}
	for i, j := range dpFioJobs {
		keep(j.name, "IOPS", iops[i])
	}
}

// fioJob is one fio job: its name, its rw mode and its queue depth.
type fioJob struct {
	name, rw string
	qd       int
}

// fioArgs are fio's arguments for jobs on file (4 KiB, libaio, O_DIRECT when direct is 1, dpFioMiB,
// dpFioRuntime a job, one after the other), with JSON output.
func fioArgs(file string, direct int, jobs []fioJob) []string {
	args := []string{"--filename=" + file, fmt.Sprintf("--size=%dM", dpFioMiB), "--bs=4k", "--ioengine=libaio",
		fmt.Sprintf("--direct=%d", direct), "--runtime=" + dpFioRuntime, "--time_based", "--output-format=json"}
	for _, j := range jobs {
		args = append(args, "--name="+j.name, "--rw="+j.rw, fmt.Sprintf("--iodepth=%d", j.qd), "--stonewall")
	}
	return args
}

// fioIOPS reads each job's IOPS (reads or writes, as its rw) from fio's JSON output.
func fioIOPS(out string, jobs []fioJob) ([]float64, error) {
	var res struct {
		Jobs []struct {
			Name  string                 `json:"jobname"`
			Read  struct{ IOPS float64 } `json:"read"`
			Write struct{ IOPS float64 } `json:"write"`
		} `json:"jobs"`
	}
	// fio may print notes before its JSON.
	if i := strings.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Jobs) != len(jobs) {
		return nil, fmt.Errorf("bad output %q: %v", out, err)
	}
	iops := make([]float64, len(jobs))
	for i, j := range jobs {
		got := res.Jobs[i]
		iops[i] = got.Read.IOPS
		if j.rw == "randwrite" {
			iops[i] = got.Write.IOPS
		}
		if got.Name != j.name || iops[i] <= 0 {
			return nil, fmt.Errorf("job %d is %q with %v IOPS, want %s with some: %s", i, got.Name, iops[i], j.name, out)
		}
	}
	return iops, nil
}

// dpTargets are the workloads whose blk/virtiofs ratio must reach 5: small files, random reads, SQLite.
var dpTargets = map[string]bool{
	"smallfile-create": true, "smallfile-stat": true, "smallfile-read": true,
	"rand-read-qd1": true, "rand-read-qd32": true, "sqlite-wal": true, "sqlite-delete": true,
}

// record records every figure: for each workload the per-round ratios of blk to each share (without the
// host's cache, then with it); for the workloads with a target, the ratios of the ceilings to virtio-fs,
// which bound what any guest path can reach against it; then the rates of every path and ceiling.
func (r *dpRun) record(blk, blkc, virtiofs, ninep, tmpfs, host *dpPath) {
	r.b.Helper()
	for _, w := range r.order {
		rates := r.rates[w]
		ratio := func(num, den, name, about string, target bool) {
			n, d := rates[num], rates[den]
			if len(n) == 0 || len(n) != len(d) {
				return
			}
			s := make([]float64, len(n))
			for i := range n {
				s[i] = n[i] / d[i]
			}
			f := benchfig.Figure{Name: "datapath/" + w + "-" + name, Unit: "x", About: w + ": " + about, Samples: s}
			if target {
				f.Target = benchfig.AtLeast(5)
			}
			benchfig.Record(r.b, f)
		}
		vfsWarm := virtiofs.name + "-hostcache"
		if _, ok := rates[vfsWarm]; !ok {
			// A write: the shares are measured once, with the host's cache as they always have it.
			vfsWarm = virtiofs.name
		}
		ratio(blk.name, virtiofs.name, "blk-vs-virtiofs", "virtio-blk volume (crust) over a virtio-fs share (Kata's default), host page cache in neither", dpTargets[w])
		ratio(blk.name, ninep.name, "blk-vs-9p", "virtio-blk volume (crust) over a 9p share (Kata's options), host page cache in neither", false)
		ratio(blkc.name, vfsWarm, "blk-vs-virtiofs-hostcache", "virtio-blk volume over a virtio-fs share, host page cache in both", dpTargets[w])
		if dpTargets[w] {
			ratio(host.name, virtiofs.name, "host-vs-virtiofs", "the host's own rate over virtio-fs's: about the most a guest path could gain on this host", false)
			ratio(tmpfs.name, virtiofs.name, "guest-tmpfs-vs-virtiofs", "the guest's tmpfs over virtio-fs: the most the emulated guest allows", false)
		}
	}
	r.recordRates("datapath/")
}

// recordRates records the rates of every workload on every path, as figures named prefix, the workload
// and the path.
func (r *dpRun) recordRates(prefix string) {
	r.b.Helper()
	for _, w := range r.order {
		for _, n := range slices.Sorted(maps.Keys(r.rates[w])) {
			benchfig.Record(r.b, benchfig.Figure{Name: prefix + w + "-" + n, Unit: r.units[w],
				About: w + " on " + n, Samples: r.rates[w][n]})
		}
	}
}

// makeImage makes a sparse file of size bytes at p holding an empty ext4 with 4 KiB blocks.
func makeImage(b *testing.B, p string, size int64) {
	b.Helper()
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	_ = f.Close()
	harness.Run(b, "mkfs.ext4", "-q", "-F", "-b", "4096", p)
}

// attachLoop attaches file to a loop device, with direct I/O to the file when direct (so the host's page
// cache holds none of it), and detaches it at cleanup.
func attachLoop(b *testing.B, file string, direct bool) string {
	b.Helper()
	args := []string{"--find", "--show"}
	if direct {
		args = append(args, "--direct-io=on")
	}
	out, err := exec.Command("losetup", append(args, file)...).Output()
	if err != nil {
		b.Fatalf("losetup %s: %v: %s", file, err, stderrOf(err))
	}
	dev := strings.TrimSpace(string(out))
	b.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			b.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	if direct {
		if d, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/dio"); err != nil || strings.TrimSpace(string(d)) != "1" {
			b.Fatalf("%s does not do direct I/O to %s (dio %q, %v)", dev, file, d, err)
		}
	}
	return dev
}
