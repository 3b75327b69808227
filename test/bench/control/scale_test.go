package control

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
)

const (
	// scaleHeld and scaleListed are how many descriptors the loaded crustds hold.
	scaleHeld   = 10_000
	scaleListed = 100_000
	// scalePairs is how many pairs a round times on each of the empty and the loaded crustd.
	scalePairs = 200
)

// BenchmarkScale measures crustd holding many descriptors against crustd holding none, one round an op
// (run it with -benchtime 9x); every crustd has its store and Kata directory on tmpfs. Figures:
//
//   - scale/pair-p50-10k-vs-0: the median time of a StageVolume+UnstageVolume pair with 10,000
//     descriptors held over the same with none, side by side. At most 1.1.
//   - scale/rss-10k: crustd's resident memory holding 10,000, in MiB, after the round's calls. Under 48.
//   - scale/restart-10k: the time crustd takes to start over 10,000 records (its own measure, from its
//     "serving" log line: opening and checking the store, rebuilding the Kata projection, serving), in
//     seconds. Under 0.3.
//   - scale/list-per-item-100k-vs-10k: the time per descriptor of listing 100,000 (every page of
//     ListVolumes) over that of listing 10,000: 1 when listing time grows linearly. At most 1.2.
func BenchmarkScale(b *testing.B) {
	ctx := context.Background()
	tmpfs := dirOn(b, tmpfsMagic, "tmpfs")
	empty := startEnv(b, tmpfs+"/state0", tmpfs+"/kata0", 1)
	held := startEnv(b, tmpfs+"/state10k", tmpfs+"/kata10k", 1)
	held.stageMany(b, scaleHeld)
	listed := startEnv(b, tmpfs+"/state100k", tmpfs+"/kata100k", 1)
	listed.stageMany(b, scaleListed)

	var p50, rss, restart, list []float64
	round := 0
	for b.Loop() {
		first := round%2 == 0
		round++
		var loaded, none time.Duration
		if first {
			loaded, none = held.pairP50(ctx, b), empty.pairP50(ctx, b)
		} else {
			none, loaded = empty.pairP50(ctx, b), held.pairP50(ctx, b)
		}
		p50 = append(p50, ratio(loaded, none))

		// Memory as it stands after serving the round's calls, before the restart starts afresh.
		kb, err := held.d.RSSKiB()
		if err != nil {
			b.Fatal(err)
		}
		rss = append(rss, float64(kb)/1024)
		held.d.Restart()
		took, err := time.ParseDuration(harness.LogValue(held.d.Log(), "serving", "start_took"))
		if err != nil {
			b.Fatalf("crustd's serving line has no start_took: %v", err)
		}
		restart = append(restart, took.Seconds())

		var tenK, hundredK time.Duration
		if first {
			tenK, hundredK = held.listAll(ctx, b, scaleHeld), listed.listAll(ctx, b, scaleListed)
		} else {
			hundredK, tenK = listed.listAll(ctx, b, scaleListed), held.listAll(ctx, b, scaleHeld)
		}
		list = append(list, ratio(hundredK/scaleListed, tenK/scaleHeld))
	}
	b.StopTimer()
	record(b, "scale/pair-p50-10k-vs-0", p50)
	record(b, "scale/rss-10k", rss)
	record(b, "scale/restart-10k", restart)
	record(b, "scale/list-per-item-100k-vs-10k", list)
}

// stageMany stages n more descriptors on e, of targets of their own and one shared image file, from 8
// clients at once.
func (e *env) stageMany(b *testing.B, n int) {
	b.Helper()
	img := e.specs[0].GetVolumeBackingPath()
	kubelet := filepath.Join(e.d.KubeletDir, "pods")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < n; i += 8 {
				pod := fmt.Sprintf("0f0f0f0f-0000-4000-8000-%012d", i/1000)
				pv := fmt.Sprintf("many-%d", i)
				dir := filepath.Join(kubelet, pod, "volumes", "kubernetes.io~csi", pv)
				if err := os.MkdirAll(dir, 0o750); err != nil {
					errs <- err
					return
				}
				_, err := e.vols.StageVolume(context.Background(), &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
					VolumeTargetPath: filepath.Join(dir, "mount"), VolumeBackingPath: img,
					VolumeType: crustv1.VolumeType_VOLUME_TYPE_FILE, FsType: "ext4", VolumeId: pv, CsiDriver: "bench.csi", PodUid: pod,
				}})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("staging %d descriptors: %v", n, err)
	}
}

// pairP50 times scalePairs pairs of e's first volume and returns the median.
func (e *env) pairP50(ctx context.Context, b *testing.B) time.Duration {
	ds := make([]time.Duration, scalePairs)
	for i := range ds {
		t0 := time.Now()
		e.stage(ctx, b, e.specs[0])
		e.unstage(ctx, b, e.specs[0])
		ds[i] = time.Since(t0)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// listAll lists every descriptor of e, page by page, checks that there are want, and returns the time.
func (e *env) listAll(ctx context.Context, b *testing.B, want int) time.Duration {
	t0 := time.Now()
	n, token := 0, ""
	for {
		r, err := e.vols.ListVolumes(ctx, &crustv1.ListVolumesRequest{StartingToken: token})
		if err != nil {
			b.Fatal(err)
		}
		n += len(r.GetVolumes())
		if token = r.GetNextToken(); token == "" {
			break
		}
	}
	took := time.Since(t0)
	if n != want {
		b.Fatalf("listed %d descriptors, want %d", n, want)
	}
	return took
}
