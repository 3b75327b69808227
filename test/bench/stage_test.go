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

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/handler"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/benchfig"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// The handler's log messages the benchmark follows (examples/microvm/handler).
const (
	msgReady      = "ready"
	msgWaiting    = "nothing staged at the target yet; waiting for it"
	msgMounted    = "volume mounted"
	msgNotMounted = "volume not attached; trying again when its descriptor changes"
)

// volumeSize is the size of each benchmark volume of BenchmarkStageToMounted.
const volumeSize = 64 << 20

// sandboxVolumes is how many volumes one handler run takes before the benchmark starts another: the VM has
// 8 hot-plug ports, and the handler keeps a volume attached until it stops.
const sandboxVolumes = 7

// BenchmarkStageToMounted measures, for a running crust-microvm sandbox (handler.Run in this process, its
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

	var crustT, bareT, tookT []time.Duration
	var bt *batch
	defer func() {
		if bt != nil {
			bt.stop(b)
		}
	}()
	for b.Loop() {
		b.StopTimer()
		i := len(crustT)
		if bt == nil || bt.used == sandboxVolumes {
			if bt != nil {
				bt.stop(b)
			}
			bt = startBatch(b, d, g, fmt.Sprintf("bench-%d", i/sandboxVolumes))
		}
		j := bt.used
		bt.used++
		target, guestPath := bt.sb.targets[j], bt.sb.guestPaths[j]
		lc, lb := newLoop(b, work, volumeSize), newLoop(b, work, volumeSize)
		bt.sb.loops = append(bt.sb.loops, lc)
		bt.bareLoops = append(bt.bareLoops, lb)

		viaCrust := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			b.StartTimer()
			t0 := time.Now()
			_, err := volumes.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
				VolumeTargetPath: target, VolumeBackingPath: lc.dev, FsType: "ext4",
			}})
			if err != nil {
				b.Fatalf("StageVolume: %v", err)
			}
			ev := bt.sb.await(ctx, b, msgMounted, target)
			b.StopTimer()
			crustT = append(crustT, ev.at.Sub(t0))
			if v, ok := ev.attrs["took"]; ok && v.Kind() == slog.KindDuration {
				tookT = append(tookT, v.Duration())
			}
		}
		bareID := fmt.Sprintf("bare-%d", j)
		viaVM := func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			t0 := time.Now()
			if err := bt.bare.AttachBlock(ctx, bareID, lb.dev, false); err != nil {
				b.Fatal(err)
			}
			if _, err := bt.bare.Agent().Mount(ctx, &agentv1.MountRequest{Serial: bareID, FsType: "ext4", Target: "/bench/" + bareID}); err != nil {
				b.Fatal(err)
			}
			bareT = append(bareT, time.Since(t0))
		}
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

	c, r := mean(crustT), mean(bareT)
	b.ReportMetric(ms(c-r), "overhead-ms/op")
	ratios, crustMs := make([]float64, len(crustT)), make([]float64, len(crustT))
	for i := range crustT {
		ratios[i], crustMs[i] = float64(crustT[i])/float64(bareT[i]), ms(crustT[i])
	}
	benchfig.Record(b, benchfig.Figure{Name: "vm/time-to-volume-vs-bare", Unit: "x", Samples: ratios, Target: benchfig.AtMost(1.1),
		About: "StageVolume on crustd to the volume mounted in a running guest / the same device hot-plugged and mounted by hand, per op (median: p50)"})
	benchfig.Record(b, benchfig.Figure{Name: "vm/time-to-volume-p99-vs-bare", Unit: "x", Target: benchfig.AtMost(1.1),
		Samples: []float64{float64(slices.Max(crustT)) / float64(slices.Max(bareT))},
		About:   "the slowest op of crust's path / the slowest by hand (p99 of so few ops is their maximum)"})
	benchfig.Record(b, benchfig.Figure{Name: "vm/time-to-volume", Unit: "ms", Samples: crustMs,
		About: "StageVolume on crustd to the volume mounted in a running guest (TCG)"})
	b.Logf("crust ms by op: %s", msList(crustT))
	b.Logf("bare ms by op: %s", msList(bareT))
	if len(tookT) == len(crustT) {
		b.Logf("the handler's claim, hot-plug and mount, ms by op: %s", msList(tookT))
		b.ReportMetric(ms(c-mean(tookT)), "stage-to-pickup-ms/op")
	}
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
	return &batch{sb: sb, bare: r.v}
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

// sandboxRun is one handler.Run of a sandbox with targets waiting to be staged.
type sandboxRun struct {
	d                   *daemon
	name, stateDir      string
	targets, guestPaths []string
	used                int    // targets staged so far
	loops               []loop // their devices, freed at stop
	log                 *hookOut
	backlog             []logEvent // events read but not awaited yet
	cancel              context.CancelFunc
	done                chan error
}

// startSandbox runs the handler for sandbox name with n volumes and returns once every volume waits for its
// target to be staged.
func startSandbox(b *testing.B, d *daemon, g guestImages, name string, n int) *sandboxRun {
	b.Helper()
	logger, out := newHook(msgReady, msgWaiting, msgMounted, msgNotMounted)
	s := &sandboxRun{d: d, name: name, stateDir: b.TempDir(), log: out, done: make(chan error, 1)}
	cfg := handler.Config{Name: name, CrustSocket: d.socket, Accel: accel(), StateDir: s.stateDir, Assets: g.assets, Log: logger}
	for j := range n {
		s.targets = append(s.targets, d.target(b, "0b5e0000-0000-4000-8000-00000000be01", fmt.Sprintf("pv-%s-%d", name, j)))
		s.guestPaths = append(s.guestPaths, fmt.Sprintf("/bench/crust-%d", j))
		cfg.Volumes = append(cfg.Volumes, handler.Volume{Target: s.targets[j], GuestPath: s.guestPaths[j]})
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.done <- handler.Run(ctx, cfg) }()
	wctx, wcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer wcancel()
	s.await(wctx, b, msgReady, "")
	for _, t := range s.targets {
		s.await(wctx, b, msgWaiting, t)
	}
	// The watch replays what is staged when it connects, so nothing is lost should it not be up yet; this
	// lets it connect, so that the first op does not pay for it.
	time.Sleep(500 * time.Millisecond)
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
	res, err := handler.Exec(ctx, s.stateDir, s.name, []string{"cat", "/proc/mounts"})
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
// stopped at cleanup.
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
	return v
}
