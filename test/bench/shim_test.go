package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/examples/microvm/initramfs"
	"crust.dev/crust/internal/testutil/benchfig"
	"crust.dev/crust/internal/testutil/ctrdtest"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/test/bench/dataload"
)

// The shim benchmark's sizes.
const (
	// shimVolume is the size of each op's volume (an ext4 on a loop device, on either side).
	shimVolume = 128 << 20
	// shimImage is the image the containers run: the guest's tools, dataload and fio.
	shimImage = "crust.dev/bench/tools:1"
	// shimTmpfs is where the deferred side's container has a tmpfs (made in the guest): the emulated
	// CPU's ceiling.
	shimTmpfs = "/scratch"
)

// shimSide is one way of giving the container its volume.
type shimSide struct {
	name     string // "deferred" or "virtiofs"
	deferred bool
}

// shimOp is what one op of one side measured.
type shimOp struct {
	start, release time.Duration
	rss            map[string]float64 // MiB by process: shim, qemu, virtiofsd
}

// BenchmarkShimPod runs containers through containerd 1.6 (the machine's /usr/bin/containerd) and
// crust-microvm's containerd shim, each op a new sandbox (VM boot included, as a pod's start) on each of
// two sides, taking turns at going first:
//
//   - deferred: the container's volume is a target path under crustd's kubelet directory, staged in
//     crustd (a pre-made ext4 on a loop device), given to ctr as a bind mount: the shim claims it,
//     hot-plugs it and the guest mounts it;
//   - virtiofs: the same kind of loop device and ext4, mounted on the host at a directory outside the
//     kubelet directory and given as the bind mount: the shim shares it into the guest over its virtio-fs
//     share (virtiofsd cache=auto, --thread-pool-size=1: Kata's defaults), as Kata does by default.
//
// Each op measures, on each side: the start, from `ctr run` to the container's process having written
// and synced a file on the volume (its "ready" on stdout); the RSS of the shim, of QEMU and of
// virtiofsd once it runs; in the container (ctr task exec), SQLite commits (dataload sqlite, WAL and
// rollback journal, as BenchmarkDataPath) and fio random 4 KiB reads at depth 1 and 32 (libaio,
// O_DIRECT, the host's caches dropped before); and the release, from `ctr task kill -s KILL` (the
// attached `ctr run` then deletes the task) and `ctr container delete` to no QEMU, no virtiofsd, no claim
// in crustd and an empty state directory. The deferred side's container also runs the workloads on a
// tmpfs the guest makes (the emulated CPU's ceiling), and the benchmark runs them on the host on the
// virtio-fs side's host mount (the host's ceiling). A warm-up op of each side, not measured, comes first.
//
// Skipped without containerd (Debian package containerd), ctr, virtiofsd, or the guest assets; fio's
// figures without fio.
func BenchmarkShimPod(b *testing.B) {
	needVMs(b)
	if _, err := os.Stat(ctrdtest.Bin()); err != nil {
		b.Skip("skipping: no " + ctrdtest.Bin() + " (Debian package containerd)")
	}
	if _, err := exec.LookPath("ctr"); err != nil {
		b.Skip("skipping: no ctr (Debian package containerd)")
	}
	g := guest(b, "cloud")
	shim := program(b, "crust.dev/crust/examples/microvm/cmd/containerd-shim-crust-microvm-v1")
	load := program(b, "crust.dev/crust/test/bench/cmd/dataload")
	fio, fioErr := exec.LookPath("fio")
	d := startCrustd(b)
	ctrd := ctrdtest.Start(b, ctrdtest.Config{ShimDir: filepath.Dir(shim), CrustSocket: d.socket, KubeletDir: d.KubeletDir, Assets: g.assets})
	ctrd.ImportDir(b, shimImage, shimRootfs(b, load, fio, fioErr))

	r := &shimRun{b: b, d: d, c: ctrd, work: b.TempDir(), load: load, fio: fioErr == nil, rates: map[string]map[string][]float64{}}
	sides := []shimSide{{name: "deferred", deferred: true}, {name: "virtiofs"}}
	for _, s := range sides {
		r.op(s, false)
	}
	ops := map[string][]shimOp{}
	i := 0
	for b.Loop() {
		for _, s := range takeTurns(sides, i) {
			ops[s.name] = append(ops[s.name], r.op(s, true))
		}
		i++
	}
	r.record(ops["deferred"], ops["virtiofs"])
}

// shimRootfs lays out the containers' root: the guest's tools (busybox and the filesystem tools with
// their libraries), dataload at dpProgram, and fio with its libraries when the host has it.
func shimRootfs(b *testing.B, load, fio string, fioErr error) string {
	b.Helper()
	a, err := initramfs.LoadAssets(assetsDir(), "cloud")
	if err != nil {
		b.Skipf("skipping: no guest assets: %v", err)
	}
	root := filepath.Join(b.TempDir(), "rootfs")
	harness.Run(b, "cp", "-a", a.Tools, root)
	files := []initramfs.File{{Name: dpProgram, Source: load, Mode: 0o755}}
	if fioErr == nil {
		fioFiles, err := initramfs.Executable(fio)
		if err != nil {
			b.Fatal(err)
		}
		files = append(files, fioFiles...)
	}
	for _, f := range files {
		dst := filepath.Join(root, f.Name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			b.Fatal(err)
		}
		harness.Run(b, "cp", "-L", "--remove-destination", f.Source, dst)
		if err := os.Chmod(dst, f.Mode); err != nil {
			b.Fatal(err)
		}
	}
	return root
}

// shimRun is the benchmark's state: crustd, containerd, and the workloads' samples.
type shimRun struct {
	b     *testing.B
	d     *daemon
	c     *ctrdtest.Containerd
	work  string
	load  string // dataload on the host
	fio   bool
	n     int                             // sandboxes started
	execs int                             // execs made
	rates map[string]map[string][]float64 // by workload and side (or ceiling)
	order []string
	units map[string]string
}

// op starts a container with its volume on side s, measures it (workloads too when measure is set),
// deletes it and waits until all is released.
func (r *shimRun) op(s shimSide, measure bool) shimOp {
	b := r.b
	b.Helper()
	r.n++
	id := fmt.Sprintf("bench-%s-%d", s.name, r.n)
	l := newLoop(b, r.work, shimVolume)
	defer l.free(b)
	volumes := crustv1.NewVolumeServiceClient(r.d.conn)
	ctx, cancel := harness.Context(b, 5*time.Minute)
	defer cancel()
	var src string
	if s.deferred {
		src = r.d.target(b, fmt.Sprintf("5a1e0000-0000-4000-8000-%012d", r.n), "pvc-bench")
		if _, err := volumes.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
			VolumeTargetPath: src, VolumeBackingPath: l.dev, FsType: "ext4",
		}}); err != nil {
			b.Fatalf("StageVolume: %v", err)
		}
		defer func() {
			if _, err := volumes.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: src}); err != nil {
				b.Errorf("UnstageVolume: %v", err)
			}
		}()
	} else {
		src = filepath.Join(r.work, id)
		if err := os.Mkdir(src, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := unix.Mount(l.dev, src, "ext4", 0, ""); err != nil {
			b.Fatalf("mounting %s on the host: %v", l.dev, err)
		}
		defer func() {
			if err := unix.Unmount(src, 0); err != nil {
				b.Errorf("unmounting %s: %v", src, err)
			}
		}()
	}

	args := []string{"run", "--runtime", ctrdtest.Runtime, "--mount", "type=bind,src=" + src + ",dst=/data,options=rbind:rw"}
	if s.deferred {
		args = append(args, "--mount", "type=tmpfs,src=tmpfs,dst="+shimTmpfs+",options=size=96m")
	}
	run := exec.Command(ctrdtest.Ctr(), r.c.Args(append(args, shimImage, id, "sh", "-c",
		`echo written > /data/f && sync && echo ready && exec sleep 100000`)...)...)
	stdout, err := run.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var runErr harness.SyncBuffer
	run.Stderr = &runErr
	ready := make(chan bool, 1)
	t0 := time.Now()
	if err := run.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	ranDone := make(chan struct{})
	go func() { _ = run.Wait(); close(ranDone) }()
	defer func() {
		select {
		case <-ranDone:
		case <-time.After(time.Minute):
			_ = run.Process.Kill()
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			<-ranDone
			b.Fatalf("ctr run %s ended before the container was ready: %s\ncontainerd's log: %s", id, runErr.String(), r.c.LogTail())
		}
	case <-ctx.Done():
		b.Fatalf("%s not ready: %v\ncontainerd's log: %s", id, ctx.Err(), r.c.LogTail())
	}
	o := shimOp{start: time.Since(t0)}
	o.rss = r.rss(id)
	if measure {
		r.workloads(s, id, src)
	}

	t1 := time.Now()
	// The task is killed; ctr run, attached, then deletes it (as it does once a task has exited).
	r.c.OK(b, "task", "kill", "--signal", "SIGKILL", id)
	select {
	case <-ranDone:
	case <-ctx.Done():
		b.Fatalf("ctr run %s did not end after its task was killed\ncontainerd's log: %s", id, r.c.LogTail())
	}
	r.c.OK(b, "container", "delete", id)
	harness.Eventually(b, time.Minute, "the sandbox's QEMU and virtiofsd to be gone and its state removed", func() bool {
		left, _ := os.ReadDir(r.c.StateDir)
		return len(r.c.Processes()) == 0 && len(left) == 0
	})
	if s.deferred {
		harness.Eventually(b, time.Minute, "the claim to be released", func() bool {
			v, err := volumes.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: src})
			return err == nil && v.GetVolume().GetClaim() == nil
		})
	}
	o.release = time.Since(t1)
	return o
}

// rss answers the resident memory, in MiB, of the shim serving container id and of the processes it
// started (QEMU, virtiofsd, summed by kind).
func (r *shimRun) rss(id string) map[string]float64 {
	r.b.Helper()
	m := map[string]float64{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		kind := ""
		switch base := filepath.Base(argv[0]); {
		case base == "containerd-shim-crust-microvm-v1" && slices.Contains(argv, id) && slices.Contains(argv, r.c.Socket):
			kind = "shim"
		case strings.Contains(string(cmdline), r.c.StateDir+"/") && strings.HasPrefix(base, "qemu-system"):
			kind = "qemu"
		case strings.Contains(string(cmdline), r.c.StateDir+"/") && strings.Contains(base, "virtiofsd"):
			kind = "virtiofsd"
		default:
			continue
		}
		if kib := vmRSS(filepath.Dir(p)); kib > 0 {
			m[kind] += float64(kib) / 1024
		}
	}
	for _, k := range []string{"shim", "qemu", "virtiofsd"} {
		if m[k] == 0 {
			r.b.Fatalf("no %s process found for %s (found %v)", k, id, m)
		}
	}
	return m
}

// vmRSS is the VmRSS, in KiB, of the process at /proc/PID, or 0.
func vmRSS(proc string) int {
	b, _ := os.ReadFile(filepath.Join(proc, "status"))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// workloads runs the in-container workloads on the volume at /data (and, on the deferred side, on the
// guest's tmpfs; on the virtio-fs side, on the host's mount at src as the host's ceiling).
func (r *shimRun) workloads(s shimSide, id, src string) {
	r.b.Helper()
	inContainer := func(args ...string) string { return r.exec(id, args...) }
	r.sqlite(s.name, "/data", dpProgram, inContainer)
	r.fioRand(s.name, "/data", dpProgram, inContainer)
	if s.deferred {
		r.sqlite("guest-tmpfs", shimTmpfs, dpProgram, inContainer)
		r.fioRand("guest-tmpfs", shimTmpfs, dpProgram, inContainer)
		return
	}
	onHost := func(args ...string) string {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			r.b.Fatalf("%s on the host: %v: %s", strings.Join(args, " "), err, stderrOf(err))
		}
		return string(out)
	}
	r.sqlite("host", filepath.Join(src, "host"), r.load, onHost)
	r.fioRand("host", filepath.Join(src, "host"), r.load, onHost)
}

// exec runs args in container id (ctr task exec) and answers its stdout.
func (r *shimRun) exec(id string, args ...string) string {
	r.execs++
	return r.c.OK(r.b, append([]string{"task", "exec", "--exec-id", "x" + strconv.Itoa(r.execs), id}, args...)...)
}

// sqlite runs dataload (at prog) SQLite workloads (WAL, rollback journal) in dir through run.
func (r *shimRun) sqlite(place, dir, prog string, run func(args ...string) string) {
	r.b.Helper()
	run("mkdir", "-p", dir)
	for _, j := range []string{"wal", "delete"} {
		out := run(prog, "sqlite", "-db", dir+"/db-"+j, "-journal", j, "-tx", strconv.Itoa(dpTx))
		var res dataload.Result
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.Seconds <= 0 {
			r.b.Fatalf("dataload sqlite on %s: bad result %q: %v", place, out, err)
		}
		r.keep("sqlite-"+j, place, "tx/s", res.Rate())
	}
}

// shimFioJobs are the fio jobs of each fio run: 4 KiB random reads at queue depth 1 and 32.
var shimFioJobs = dpFioJobs[:2]

// fioRand lays out fio's file in dir with dataload, drops the host's caches and runs shimFioJobs (libaio,
// O_DIRECT but on tmpfs, dpFioRuntime each, one process) through run.
func (r *shimRun) fioRand(place, dir, prog string, run func(args ...string) string) {
	r.b.Helper()
	if !r.fio {
		return
	}
	run(prog, "write", "-file", dir+"/fio", "-mib", strconv.Itoa(dpFioMiB))
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		r.b.Fatalf("dropping the host's caches: %v", err)
	}
	direct := 1
	if place == "guest-tmpfs" {
		direct = 0
	}
	out := run(append([]string{"fio"}, fioArgs(dir+"/fio", direct, shimFioJobs)...)...)
	iops, err := fioIOPS(out, shimFioJobs)
	if err != nil {
		r.b.Fatalf("fio on %s: %v", place, err)
	}
	for i, j := range shimFioJobs {
		r.keep(j.name, place, "IOPS", iops[i])
	}
}

// keep keeps a sample of workload on place.
func (r *shimRun) keep(workload, place, unit string, v float64) {
	if r.rates[workload] == nil {
		r.rates[workload] = map[string][]float64{}
		if r.units == nil {
			r.units = map[string]string{}
		}
		r.units[workload] = unit
		r.order = append(r.order, workload)
	}
	r.rates[workload][place] = append(r.rates[workload][place], v)
}

// record records the figures: the start's per-op ratio (median: p50) and p99 ratio with each side's
// times; the release's ratio and times; each process's RSS and the total's ratio; and for each
// workload the per-op ratio deferred / virtio-fs, the ceilings over virtio-fs, and the rates.
func (r *shimRun) record(def, vfs []shimOp) {
	b := r.b
	b.Helper()
	if len(def) == 0 || len(def) != len(vfs) {
		return
	}
	durations := func(ops []shimOp, f func(shimOp) time.Duration) []time.Duration {
		var ds []time.Duration
		for _, o := range ops {
			ds = append(ds, f(o))
		}
		return ds
	}
	ratios := func(x, y []float64) []float64 {
		rs := make([]float64, len(x))
		for i := range x {
			rs[i] = x[i] / y[i]
		}
		return rs
	}
	start := func(o shimOp) time.Duration { return o.start }
	release := func(o shimOp) time.Duration { return o.release }
	ds, vs := msEach(durations(def, start)), msEach(durations(vfs, start))
	benchfig.Record(b, benchfig.Figure{Name: "shim/start-deferred-vs-virtiofs", Unit: "x", Samples: ratios(ds, vs),
		About: "ctr run to the container's write on its volume, a new sandbox each: deferred volume / virtio-fs share, per op (median: p50)"})
	benchfig.Record(b, benchfig.Figure{Name: "shim/start-p99-deferred-vs-virtiofs", Unit: "x", Samples: []float64{slices.Max(ds) / slices.Max(vs)},
		About: "the slowest start of each side (p99 of so few ops is their maximum)"})
	benchfig.Record(b, benchfig.Figure{Name: "shim/start-deferred", Unit: "ms", Samples: ds, About: "ctr run to the write on the deferred volume, VM boot included (TCG)"})
	benchfig.Record(b, benchfig.Figure{Name: "shim/start-virtiofs", Unit: "ms", Samples: vs, About: "ctr run to the write on the virtio-fs share, VM boot included (TCG)"})
	dr, vr := msEach(durations(def, release)), msEach(durations(vfs, release))
	benchfig.Record(b, benchfig.Figure{Name: "shim/release-deferred-vs-virtiofs", Unit: "x", Samples: ratios(dr, vr),
		About: "task kill + delete + container delete to no QEMU, virtiofsd, claim or state: deferred / virtio-fs"})
	benchfig.Record(b, benchfig.Figure{Name: "shim/release-deferred", Unit: "ms", Samples: dr, About: "delete to all released, deferred volume (claim included)"})
	benchfig.Record(b, benchfig.Figure{Name: "shim/release-virtiofs", Unit: "ms", Samples: vr, About: "delete to all released, virtio-fs share"})
	total := func(ops []shimOp) []float64 {
		var t []float64
		for _, o := range ops {
			t = append(t, o.rss["shim"]+o.rss["qemu"]+o.rss["virtiofsd"])
		}
		return t
	}
	for _, k := range []string{"shim", "qemu", "virtiofsd"} {
		for _, side := range []struct {
			name string
			ops  []shimOp
		}{{"deferred", def}, {"virtiofs", vfs}} {
			var s []float64
			for _, o := range side.ops {
				s = append(s, o.rss[k])
			}
			benchfig.Record(b, benchfig.Figure{Name: "shim/rss-" + k + "-" + side.name, Unit: "MiB", Samples: s,
				About: "resident memory of the sandbox's " + k + " once the container runs, " + side.name + " side"})
		}
	}
	benchfig.Record(b, benchfig.Figure{Name: "shim/rss-total-deferred-vs-virtiofs", Unit: "x", Samples: ratios(total(def), total(vfs)),
		About: "shim + QEMU + virtiofsd resident memory per sandbox: deferred / virtio-fs"})
	for _, w := range r.order {
		rates := r.rates[w]
		if len(rates["deferred"]) != len(rates["virtiofs"]) {
			continue
		}
		benchfig.Record(b, benchfig.Figure{Name: "shim/" + w + "-deferred-vs-virtiofs", Unit: "x", Samples: ratios(rates["deferred"], rates["virtiofs"]),
			About: w + " in the container: deferred volume / virtio-fs share, per op"})
		for _, c := range []string{"guest-tmpfs", "host"} {
			if len(rates[c]) == len(rates["virtiofs"]) {
				benchfig.Record(b, benchfig.Figure{Name: "shim/" + w + "-" + c + "-vs-virtiofs", Unit: "x", Samples: ratios(rates[c], rates["virtiofs"]),
					About: w + ": the " + c + " ceiling / virtio-fs share"})
			}
		}
		for _, p := range []string{"deferred", "virtiofs", "guest-tmpfs", "host"} {
			if len(rates[p]) > 0 {
				benchfig.Record(b, benchfig.Figure{Name: "shim/" + w + "-" + p, Unit: r.units[w], Samples: rates[p], About: w + " on " + p})
			}
		}
	}
	b.Logf("start ms by op: deferred %s; virtio-fs %s", msList(durations(def, start)), msList(durations(vfs, start)))
	b.Logf("release ms by op: deferred %s; virtio-fs %s", msList(durations(def, release)), msList(durations(vfs, release)))
}
