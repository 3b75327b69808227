package e2e

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMKillUnderLoad kills `crust-microvm run` with SIGKILL at random instants, at least 100 times
// (CRUST_MICROVM_KILLS to change it), while its volumes are being claimed, mounted, measured and released,
// and starts it again after each kill. Two sandboxes, each with a pod and volumes of its own, take the
// kills from one count, side by side on one crustd: a round mostly waits for its guest to boot under TCG,
// which keeps one core busy, so two at once take about half the time one after the other would, and as
// rounds differ in length (those under load are longer), a sandbox whose rounds ran long takes fewer
// kills and the two end together. Half the kills land at
// a random instant of the first 3 s of a run (QEMU starting, the guest booting, claims and mounts: no boot
// is waited for), half once the data volume is mounted, within 2 s of starting a load on it: files written
// in the guest (temporary file, sync, rename, sync: acknowledged when that exec returns 0), stats forwarded
// through crustd, a second volume staged to be claimed and mounted, and in a third of those rounds a
// `crust-microvm stop` (unmount, detach, release) racing the kill.
//
// After each kill: QEMU is gone within seconds (it dies with its parent); crustd holds no claim of the
// dead sandbox once its grace (5 s) has passed (detection latency logged); the next run cleans the stale
// sockets and claims again. Whenever the data volume is mounted, every acknowledged file is there with its
// content, and a file whose write was in flight at the kill is either absent or whole. At the end a clean
// stop leaves no socket, no pid file, no process and no claim.
func TestMicroVMKillUnderLoad(t *testing.T) {
	kills := 100
	if s := os.Getenv("CRUST_MICROVM_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("CRUST_MICROVM_KILLS: %v", err)
		}
		kills = n
	}
	d, assets := newMicroVMDaemon(t, "--handler-grace", killGrace.String())
	vols := crustv1.NewVolumeServiceClient(d.conn())
	var left atomic.Int64 // kills still to make, by either sandbox
	left.Store(int64(kills))
	pods := []string{"9b1c9e0a-0000-4000-8000-0000000c4a5e", "9b1c9e0a-0000-4000-8000-0000000c4a5f"}
	for i, pod := range pods {
		name := fmt.Sprintf("e2e-kill-%d", i+1)
		data, extra := d.podTarget(pod, "pvc-data"), d.podTarget(pod, "pvc-extra")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			killUnderLoad(t, d, vols, assets, name, data, extra, &left)
		})
	}
}

// killGrace is crustd's --handler-grace in TestMicroVMKillUnderLoad.
const killGrace = 5 * time.Second

// killUnderLoad is one sandbox's part of TestMicroVMKillUnderLoad: kills of the sandbox name, whose
// volumes are data (its files) and extra (staged during a load), on d, while left says kills are still to
// make (each kill takes one; the last rounds of two sandboxes may make one more between them).
func killUnderLoad(t *testing.T, d *daemon, vols crustv1.VolumeServiceClient, assets, name, data, extra string, left *atomic.Int64) {
	ctx := context.Background()
	stateDir := t.TempDir()
	dataDev, extraDev := loopDevice(t, 64<<20), loopDevice(t, 32<<20)
	harness.Run(t, "mkfs.ext4", "-q", "-F", dataDev)
	harness.Run(t, "mkfs.ext4", "-q", "-F", extraDev)
	stage := func(target, dev string) {
		t.Helper()
		if _, err := vols.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
			VolumeTargetPath: target, VolumeBackingPath: dev, VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK, FsType: "ext4",
		}}); err != nil {
			t.Fatalf("stage %s: %v", target, err)
		}
	}
	stage(data, dataDev)
	claimOf := func(target string) *crustv1.Claim {
		t.Helper()
		r, err := vols.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
		if status.Code(err) == codes.NotFound {
			return nil
		}
		if err != nil {
			t.Fatalf("get %s: %v", target, err)
		}
		return r.GetVolume().GetClaim()
	}
	bin := filepath.Join(binDir, "crust-microvm")
	microvm := func(args ...string) *exec.Cmd {
		return exec.Command(bin, append([]string{"--state-dir", stateDir}, args...)...)
	}

	const dataMounted = `awk '$2 == "/data" {f=1} END {exit !f}' /proc/mounts`
	// The files written in the guest: f-N holds "N\n" repeated up to fileSize bytes.
	const fileSize = 64 << 10
	content := func(n int) []byte {
		line := []byte(strconv.Itoa(n) + "\n")
		return bytes.Repeat(line, fileSize/len(line)+1)[:fileSize]
	}
	sum := func(n int) string { s := md5.Sum(content(n)); return hex.EncodeToString(s[:]) }
	var (
		mu       sync.Mutex
		acked    = map[int]bool{} // acknowledged: must be there, whole
		inFlight = map[int]bool{} // cut by a kill: absent or whole
		next     int
	)
	var ackedWrites, ackedStats, claimsSeen, inFlightWhole, inFlightAbsent, verifications atomic.Int64
	// verify checks the data volume in the running guest against what was acknowledged.
	verify := func() bool {
		t.Helper()
		out, err := microvm("exec", name, "--", "sh", "-c", dataMounted+" && cd /data && rm -f .tmp-* && { md5sum f-* 2>/dev/null; true; }").Output()
		if err != nil {
			return false // the run ended meanwhile: checked at the next mount
		}
		found := map[int]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Fields(l)
			if len(f) != 2 {
				continue
			}
			n, err := strconv.Atoi(strings.TrimPrefix(f[1], "f-"))
			if err != nil {
				t.Fatalf("unexpected file %q in the data volume", f[1])
			}
			found[n] = f[0]
		}
		mu.Lock()
		defer mu.Unlock()
		for n := range acked {
			if found[n] != sum(n) {
				t.Fatalf("acknowledged file f-%d lost or damaged (md5 %q, want %s)", n, found[n], sum(n))
			}
		}
		for n := range inFlight {
			switch found[n] {
			case "":
				inFlightAbsent.Add(1)
			case sum(n):
				inFlightWhole.Add(1)
			default:
				t.Fatalf("file f-%d, written when a kill came, is there but not whole (md5 %s, want %s)", n, found[n], sum(n))
			}
			delete(inFlight, n)
		}
		verifications.Add(1)
		return true
	}

	var latencies []time.Duration
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 10))
	t0 := time.Now()
	killed, cleanStops, loadRounds := 0, 0, 0
	for left.Load() > 0 {
		run := microvm("run", "--name", name, "--crust-socket", d.socket, "--accel", "tcg", "--assets", assets,
			"--volume", data+":/data", "--volume", extra+":/extra")
		logW := new(harness.SyncBuffer) // this run's log
		run.Stdout, run.Stderr = logW, logW
		if err := run.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- run.Wait() }()

		var killAfter time.Duration
		// Once a stop was sent the run may end by itself: 0, or 1 when the writer kept the volume busy
		// (the teardown then still stops the VM and releases the claims).
		var stopped atomic.Bool
		load := rng.IntN(2) == 0
		loadCtx, endLoad := context.WithCancel(ctx)
		var loadWG sync.WaitGroup
		if !load {
			killAfter = time.Duration(rng.Int64N(int64(3 * time.Second)))
		} else {
			// Wait until the data volume is mounted in the guest.
			mounted := false
			for deadline := time.Now().Add(3 * time.Minute); !mounted && time.Now().Before(deadline); {
				if harness.LogValue(logW.String(), "volume mounted", "took", "target="+data) != "" {
					mounted = true
					break
				}
				select {
				case err := <-exited:
					t.Fatalf("crust-microvm run exited before mounting: %v\n%s", err, logW.String())
				case <-time.After(20 * time.Millisecond):
				}
			}
			if !mounted {
				t.Fatalf("the data volume was not mounted within 3 minutes:\n%s", logW.String())
			}
			loadRounds++
			verify()
			stage(extra, extraDev) // claimed and mounted while the load runs
			loadWG.Go(func() {     // writer
				for loadCtx.Err() == nil {
					mu.Lock()
					n := next
					next++
					inFlight[n] = true
					mu.Unlock()
					// /data is checked to be the volume before and after: a racing stop unmounts it, and a
					// write after that would land in the guest's root filesystem.
					script := fmt.Sprintf("%[3]s && yes %[1]d | head -c %[2]d > /data/.tmp-%[1]d && sync && mv /data/.tmp-%[1]d /data/f-%[1]d && sync && %[3]s",
						n, fileSize, dataMounted)
					err := microvm("exec", name, "--", "sh", "-c", script).Run()
					mu.Lock()
					if err == nil {
						delete(inFlight, n)
						acked[n] = true
						ackedWrites.Add(1)
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
			loadWG.Go(func() { // stats through crustd
				for loadCtx.Err() == nil {
					if _, err := vols.GetVolumeStats(loadCtx, &crustv1.GetVolumeStatsRequest{VolumeTargetPath: data}); err == nil {
						ackedStats.Add(1)
					}
					time.Sleep(50 * time.Millisecond) // the load's pace
				}
			})
			killAfter = time.Duration(rng.Int64N(int64(2 * time.Second)))
			if rng.IntN(3) == 0 { // a stop racing the kill: unmount, detach, release
				stopAfter := time.Duration(rng.Int64N(int64(killAfter) + 1))
				loadWG.Go(func() {
					select {
					case <-time.After(stopAfter):
						stopped.Store(true)
						_ = microvm("stop", name).Run()
					case <-loadCtx.Done():
					}
				})
			}
		}

		// The kill.
		var heldAtKill bool
		select {
		case err := <-exited:
			// The run ended by itself before the kill: only a racing stop may do that.
			if !stopped.Load() {
				t.Fatalf("crust-microvm run exited before the kill: %v\n%s", err, logW.String())
			}
			cleanStops++
		case <-time.After(killAfter):
			heldAtKill = claimOf(data).GetSandboxId() == name
			_ = run.Process.Signal(syscall.SIGKILL)
			if err := <-exited; err == nil || !strings.Contains(err.Error(), "killed") {
				// It may have finished a racing stop just before.
				if !stopped.Load() {
					t.Fatalf("run after SIGKILL: %v", err)
				}
				cleanStops++
			} else {
				killed++
				left.Add(-1)
			}
		}
		killedAt := time.Now()
		endLoad()
		loadWG.Wait()

		// QEMU dies with its parent.
		harness.Eventually(t, 10*time.Second, fmt.Sprintf("round %d: the sandbox's processes to end after the kill", killed), func() bool {
			return len(sandboxProcesses(filepath.Join(stateDir, name))) == 0
		})
		// crustd releases the dead handler's claims, within the grace at most.
		gctx, gcancel := harness.Context(t, killGrace+3*time.Second)
		err := harness.Poll(gctx, func() (bool, error) { return claimOf(data) == nil && claimOf(extra) == nil, nil })
		gcancel()
		if err != nil {
			t.Fatalf("round %d: claims held for the dead handler %s after the kill (grace %s): %v, %v\ncrustd log:\n%s",
				killed, time.Since(killedAt).Round(time.Millisecond), killGrace, claimOf(data), claimOf(extra), d.Log())
		}
		if heldAtKill {
			claimsSeen.Add(1)
			latencies = append(latencies, time.Since(killedAt))
		}
		if _, err := vols.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: extra}); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(t0)

	// A last run: everything acknowledged is there; a clean stop leaves nothing behind.
	m := startMicroVM(t, d, assets, stateDir, name, data+":/data")
	if err := <-m.WaitMountedAsync("/data"); err != nil {
		t.Fatal(err)
	}
	if !verify() {
		t.Fatal("the last run ended before its data could be checked")
	}
	m.Stop()
	files, _ := filepath.Glob(filepath.Join(stateDir, name, "*.sock"))
	if _, err := os.Stat(filepath.Join(stateDir, name, "qemu.pid")); err == nil {
		files = append(files, "qemu.pid")
	}
	if len(files) > 0 {
		t.Errorf("left after the final stop: %v", files)
	}
	if procs := sandboxProcesses(filepath.Join(stateDir, name)); len(procs) > 0 {
		t.Errorf("processes left after the final stop: %v", procs)
	}
	if c := claimOf(data); c != nil {
		t.Errorf("claim left after the final stop: %v", c)
	}

	slices.Sort(latencies)
	lat := "none measured"
	if n := len(latencies); n > 0 {
		lat = fmt.Sprintf("median %s, max %s over %d", latencies[n/2].Round(time.Millisecond), latencies[n-1].Round(time.Millisecond), n)
	}
	t.Logf("%d kills (%d rounds under load, %d stops that beat the kill) in %s; acknowledged: %d writes, %d stats; "+
		"in-flight writes found whole %d, absent %d; %d checks of the data volume; claims released after the kill: %s",
		killed, loadRounds, cleanStops, took.Round(time.Second), ackedWrites.Load(), ackedStats.Load(),
		inFlightWhole.Load(), inFlightAbsent.Load(), verifications.Load(), lat)
}

// sandboxProcesses lists the live processes whose command line names a file under dir (QEMU names its
// sockets there).
func sandboxProcesses(dir string) []string { return harness.ProcessesNaming(dir + "/") }
