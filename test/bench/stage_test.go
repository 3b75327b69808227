package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/examples/microvm/vmhandler"
	"crust.dev/crust/internal/testutil/benchfig"
)

// The handler's log messages the benchmark follows (examples/microvm/vmhandler).
const (
	msgReady      = "ready"
	msgWaiting    = "nothing staged at the target yet; waiting for it"
	msgMounted    = "volume mounted"
	msgNotMounted = "volume not attached; trying again when its descriptor changes"
	msgWatching   = "watching crustd"
)

// volumeSize is the size of each benchmark volume of BenchmarkStageToMounted.
const volumeSize = 64 << 20

// sandboxVolumes is how many volumes one handler run takes before the benchmark starts another: the VM has
// 8 hot-plug ports, and the handler keeps a volume attached until it stops.
const sandboxVolumes = 7

// BenchmarkStageToMounted measures, for a running crust-microvm sandbox (vmhandler.Run in this process, its
// VM under TCG) waiting for a target, the time from the StageVolume call on crustd to the volume mounted in
// the guest: the moment the handler has the guest agent's answer to its mount, which it logs as "volume
// mounted" (the guest's /proc/mounts is checked afterwards, untimed). Each op stages a fresh loop device
// holding an existing ext4. ns/op is that time.
//
// Side by side, in the same iterations and alternating which goes first, it measures the bare hot-plug and
// mount with crustd and the handler out of the loop: vm.AttachBlock, then the agent's mount, of a device of
// the same kind, on a second VM booted from the same images at the same time as the sandbox's and holding
// as many disks at each op (a sandbox keeps its volumes attached, and both VMs have 8 hot-plug ports, so
// both are booted again every sandboxVolumes ops, untimed). Reported per op, as means over the ops:
// crust-ms (stage to mounted), bare-ms (attach to mounted), overhead-ms (their difference), crust/bare
// (their ratio, crust's overhead as a factor), and stage-to-pickup-ms: the part of crust-ms before the
// handler starts its claim, hot-plug and mount (as it times them itself), which is the StageVolume call and
// crustd's watch event to the handler, the one step the bare path has no counterpart of; the rest
// differs from bare-ms by the claim call and by the noise of the guests.
func BenchmarkStageToMounted(b *testing.B) {
	g := guest(b, "cloud")
	d := startCrustd(b)
	volumes := crustv1.NewVolumeServiceClient(d.conn)
	work := b.TempDir()
	r := timeToVolume(b, d, g, ttvOps{name: "bench", prepare: func(bt *batch, target string) (string, func(context.Context)) {
		lc, lb := newLoop(b, work, volumeSize), newLoop(b, work, volumeSize)
		bt.sb.loops, bt.bareLoops = append(bt.sb.loops, lc), append(bt.bareLoops, lb)
		bt.sb.used++ // staged on crustd by this op: the sandbox's stop unstages it
		return lb.dev, func(ctx context.Context) {
			_, err := volumes.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
				VolumeTargetPath: target, VolumeBackingPath: lc.dev, FsType: "ext4",
			}})
			if err != nil {
				b.Fatalf("StageVolume: %v", err)
			}
		}
	}})
	r.record(b, "vm/time-to-volume", "StageVolume on crustd to the volume mounted in a running guest",
		"the same device hot-plugged and mounted by hand")
	if len(r.took) == len(r.crust) {
		b.Logf("the handler's claim, hot-plug and mount, ms by op: %s", msList(r.took))
		b.ReportMetric(ms(mean(r.crust)-mean(r.took)), "stage-to-pickup-ms/op")
	}
}

// ttvOps is what a time-to-volume benchmark (timeToVolume) does in each op.
type ttvOps struct {
	name   string // of the batches' sandboxes, with a number
	create bool   // the bare side formats its device in the guest, as crust's does
	// prepare readies, untimed, the volume of an op whose target is target in bt's sandbox, and returns
	// the bare side's device (in bt.bareLoops or released by afterBatch) and the timed call that hands
	// the volume to crust.
	prepare func(bt *batch, target string) (bareDev string, start func(context.Context))
	// afterBatch, when not nil, runs once a batch has stopped.
	afterBatch func()
}

// ttvRun is what timeToVolume measured, one element an op: crust's time from the start call to the
// handler's "volume mounted", the bare side's, and the handler's own time for its claim, hot-plug and
// mount when it logged one.
type ttvRun struct{ crust, bare, took []time.Duration }

// timeToVolume runs the ops of a time-to-volume benchmark: each takes the next target of a batch (a
// running sandbox waiting on sandboxVolumes targets, and a bare VM booted with it; a new batch, untimed,
// once one is used up), prepares it (o.prepare), and measures, alternating which goes first, crust's side
// (the start call until the handler logs the volume mounted) and the bare side (the device hot-plugged
// and mounted by hand, mountBare); the guest's mounts are checked afterwards, untimed.
func timeToVolume(b *testing.B, d *daemon, g guestImages, o ttvOps) ttvRun {
	var r ttvRun
	var bt *batch
	stop := func() {
		bt.stop(b)
		if o.afterBatch != nil {
			o.afterBatch()
		}
		bt = nil
	}
	defer func() {
		if bt != nil {
			stop()
		}
	}()
	for b.Loop() {
		b.StopTimer()
		i := len(r.crust)
		if bt == nil || bt.used == sandboxVolumes {
			if bt != nil {
				stop()
			}
			bt = startBatch(b, d, g, fmt.Sprintf("%s-%d", o.name, i/sandboxVolumes))
		}
		j := bt.used
		bt.used++
		target, guestPath := bt.sb.targets[j], bt.sb.guestPaths[j]
		bareDev, start := o.prepare(bt, target)
		viaCrust := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			b.StartTimer()
			t0 := time.Now()
			start(ctx)
			ev := bt.sb.await(ctx, b, msgMounted, target)
			b.StopTimer()
			r.crust = append(r.crust, ev.at.Sub(t0))
			if v, ok := ev.attrs["took"]; ok && v.Kind() == slog.KindDuration {
				r.took = append(r.took, v.Duration())
			}
		}
		viaVM := func() { r.bare = append(r.bare, bt.mountBare(b, j, bareDev, o.create)) }
		if i%2 == 0 {
			viaCrust()
			viaVM()
		} else {
			viaVM()
			viaCrust()
		}
		bt.sb.checkMounted(b, guestPath)
		b.StartTimer()
	}
	b.StopTimer()
	return r
}

// record reports r as name (crust's time, ms), name-vs-bare (the per-op ratios; the median is p50) and
// name-p99-vs-bare (the slowest op of each), with the target of 1.1 for both ratios, crust's side
// described by what and the bare side by bare; and the mean overhead over the bare side as a metric.
func (r ttvRun) record(b *testing.B, name, what, bare string) {
	if len(r.crust) == 0 {
		return
	}
	b.ReportMetric(ms(mean(r.crust)-mean(r.bare)), "overhead-ms/op")
	ratios, crustMs := make([]float64, len(r.crust)), msEach(r.crust)
	for i := range r.crust {
		ratios[i] = float64(r.crust[i]) / float64(r.bare[i])
	}
	benchfig.Record(b, benchfig.Figure{Name: name + "-vs-bare", Unit: "x", Samples: ratios, Target: benchfig.AtMost(1.1),
		About: what + " / " + bare + ", per op (median: p50)"})
	benchfig.Record(b, benchfig.Figure{Name: name + "-p99-vs-bare", Unit: "x", Target: benchfig.AtMost(1.1),
		Samples: []float64{float64(slices.Max(r.crust)) / float64(slices.Max(r.bare))},
		About:   "the slowest op of crust's path / the slowest by hand (p99 of so few ops is their maximum)"})
	benchfig.Record(b, benchfig.Figure{Name: name, Unit: "ms", Samples: crustMs, About: what + " (TCG)"})
	b.Logf("crust ms by op: %s", msList(r.crust))
	b.Logf("bare ms by op: %s", msList(r.bare))
}

// msList formats ds in whole milliseconds.
func msList(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprint(d.Round(time.Millisecond).Milliseconds()))
	}
	return strings.Join(parts, " ")
}

// batch is a sandbox and a bare VM booted together, which take sandboxVolumes ops.
type batch struct {
	sb        *sandboxRun
	bare      *vm.VM
	bareLoops []loop
	used      int // ops done
}

// startBatch boots the bare VM and the sandbox name at the same time.
func startBatch(b *testing.B, d *daemon, g guestImages, name string) *batch {
	b.Helper()
	type booted struct {
		v   *vm.VM
		err error
	}
	ch := make(chan booted, 1)
	stateDir := filepath.Join(b.TempDir(), "vm")
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		v, err := vm.Start(ctx, vm.Config{Kernel: g.kernel, Initramfs: g.initrd, Accel: accel(), StateDir: stateDir})
		ch <- booted{v, err}
	}()
	sb := startSandbox(b, d, g, name, sandboxVolumes)
	r := <-ch
	if r.err != nil {
		sb.stop(b)
		b.Fatal(r.err)
	}
	bt := &batch{sb: sb, bare: r.v}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := waitStarted(ctx, r.v); err != nil {
		bt.stop(b)
		b.Fatalf("the bare VM: %v", err)
	}
	return bt
}

// mountBare hot-plugs dev into the bare VM as its op j's disk and has the agent mount it (formatting it
// first when create), and returns how long that took.
func (bt *batch) mountBare(b *testing.B, j int, dev string, create bool) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := fmt.Sprintf("bare-%d", j)
	t0 := time.Now()
	if err := bt.bare.AttachBlock(ctx, id, dev, false); err != nil {
		b.Fatal(err)
	}
	if _, err := bt.bare.Agent().Mount(ctx, &agentv1.MountRequest{Serial: id, FsType: "ext4", Target: "/bench/" + id,
		CreateFilesystem: create}); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// stop stops the sandbox and the bare VM and frees their devices.
func (bt *batch) stop(b *testing.B) {
	b.Helper()
	bt.sb.stop(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := bt.bare.Stop(ctx); err != nil {
		b.Errorf("bare VM: %v", err)
	}
	for _, l := range bt.bareLoops {
		l.free(b)
	}
}

// sandboxRun is one vmhandler.Run of a sandbox with targets waiting to be staged.
type sandboxRun struct {
	d                   *daemon
	name, stateDir      string
	targets, guestPaths []string
	used                int    // targets staged on crustd straight (not through the proxy), unstaged at stop
	loops               []loop // their devices, freed at stop
	log                 *hookOut
	backlog             []logEvent // events read but not awaited yet
	cancel              context.CancelFunc
	done                chan error
}

// startSandbox runs the handler for sandbox name with n volumes and returns once every volume waits for its
// target to be staged, the handler watches crustd, and the guest agent's start is over.
func startSandbox(b *testing.B, d *daemon, g guestImages, name string, n int) *sandboxRun {
	b.Helper()
	logger, out := newHook(msgReady, msgWaiting, msgMounted, msgNotMounted, msgWatching)
	s := &sandboxRun{d: d, name: name, stateDir: b.TempDir(), log: out, done: make(chan error, 1)}
	cfg := vmhandler.Config{Name: name, CrustSocket: d.socket, Accel: accel(), StateDir: s.stateDir, Assets: g.assets, Log: logger}
	for j := range n {
		s.targets = append(s.targets, d.target(b, "0b5e0000-0000-4000-8000-00000000be01", fmt.Sprintf("pv-%s-%d", name, j)))
		s.guestPaths = append(s.guestPaths, fmt.Sprintf("/bench/crust-%d", j))
		cfg.Volumes = append(cfg.Volumes, vmhandler.Volume{Target: s.targets[j], GuestPath: s.guestPaths[j]})
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.done <- vmhandler.Run(ctx, cfg) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer wcancel()
	s.await(wctx, b, msgReady, "")
	for _, t := range s.targets {
		s.await(wctx, b, msgWaiting, t)
	}
	// The first op times neither the watch's connection nor the guest's start (its kernel modules, which
	// load on the one vCPU that the first mount needs).
	s.await(wctx, b, msgWatching, "")
	if _, err := vmhandler.Health(wctx, s.stateDir, name, true); err != nil {
		b.Fatalf("the sandbox's guest agent: %v", err)
	}
	return s
}

// await returns the handler's first log event with message msg (for target, unless "") not returned yet,
// failing b when the handler reports a failed volume, exits, or ctx ends first.
func (s *sandboxRun) await(ctx context.Context, b *testing.B, msg, target string) logEvent {
	b.Helper()
	match := func(ev logEvent) bool {
		t := ev.attrs["target"].String()
		if ev.msg == msgNotMounted {
			b.Fatalf("the handler failed to attach %s: %s\nhandler log:\n%s", t, ev.attrs["err"], s.log)
		}
		return ev.msg == msg && (target == "" || t == target)
	}
	for i, ev := range s.backlog {
		if match(ev) {
			s.backlog = append(s.backlog[:i], s.backlog[i+1:]...)
			return ev
		}
	}
	for {
		select {
		case ev := <-s.log.events:
			if match(ev) {
				return ev
			}
			s.backlog = append(s.backlog, ev)
		case err := <-s.done:
			s.done <- err
			b.Fatalf("the handler exited: %v\nhandler log:\n%s", err, s.log)
		case <-ctx.Done():
			b.Fatalf("no %q for %q from the handler: %v\nhandler log:\n%s", msg, target, ctx.Err(), s.log)
		}
	}
}

// checkMounted fails b unless the sandbox's guest lists a mount on path.
func (s *sandboxRun) checkMounted(b *testing.B, path string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := vmhandler.Exec(ctx, s.stateDir, s.name, []string{"cat", "/proc/mounts"})
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(res.Stdout), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[1] == path && f[2] == "ext4" {
			return
		}
	}
	b.Fatalf("the guest has no ext4 on %s:\n%s", path, res.Stdout)
}

// stop stops the handler (which unmounts, detaches and releases the volumes), then unstages the volumes
// and frees their devices.
func (s *sandboxRun) stop(b *testing.B) {
	b.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		if err != nil {
			b.Errorf("handler %s: %v\nhandler log:\n%s", s.name, err, s.log)
		}
	case <-time.After(3 * time.Minute):
		b.Fatalf("handler %s did not stop\nhandler log:\n%s", s.name, s.log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	volumes := crustv1.NewVolumeServiceClient(s.d.conn)
	for _, t := range s.targets[:s.used] {
		if _, err := volumes.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: t}); err != nil {
			b.Errorf("UnstageVolume %s: %v", t, err)
		}
	}
	for _, l := range s.loops {
		l.free(b)
	}
	s.loops = nil
}

// startVM boots a VM (TCG unless CRUST_BENCH_ACCEL says otherwise) with cfg's images on a temp state dir,
// stopped at cleanup, and returns once its guest agent's start is over (waitStarted).
func startVM(b *testing.B, cfg vm.Config) *vm.VM {
	b.Helper()
	cfg.Accel = accel()
	cfg.StateDir = filepath.Join(b.TempDir(), "vm")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v, err := vm.Start(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := v.Stop(context.Background()); err != nil {
			b.Error(err)
		}
	})
	if err := waitStarted(ctx, v); err != nil {
		b.Fatal(err)
	}
	return v
}

// waitStarted returns once v's guest agent has loaded its kernel modules, which load on the vCPU that a
// timed op needs: a benchmark waits for them so as not to time the guest's start.
func waitStarted(ctx context.Context, v *vm.VM) error {
	if _, err := v.Agent().Health(ctx, &agentv1.HealthRequest{WaitStarted: true}); err != nil {
		return fmt.Errorf("the guest agent's start: %w", err)
	}
	return nil
}
