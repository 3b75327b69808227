package control

import (
	"context"
	"encoding/json"
	"os/exec"
	"sync"
	"testing"
	"time"

	"crust.dev/crust/internal/testutil/benchfig"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// Pairs per round of each side.
const (
	tmpfsPairs = 200 // crust and the Kata library, on tmpfs
	ext4Pairs  = 50  // crust and the durable floor, on ext4
	cliPairs   = 10  // one crustctl process per operation
	// concurrentPairs is how many pairs the clients of a throughput round make together, on tmpfs and on
	// ext4.
	concurrentPairs     = 960
	concurrentPairsExt4 = 160
)

// BenchmarkPair measures a StageVolume+UnstageVolume pair, from a client on crustd's socket as a driver
// calls it, against its floors, one round an op (run it with -benchtime 9x). Figures, each a per-round
// ratio:
//
//   - control/pair-vs-kata-lib: crust's pair, its store and Kata directory on tmpfs, over the same
//     volumes' add and remove through an in-process equivalent of Kata's direct-volume library (kataLib)
//     on tmpfs. At most 4.
//   - control/pair-vs-durable-floor: crust's pair, its store on ext4 (Kata directory on tmpfs), over the
//     least a durable record and its removal take on that ext4 (durableFloor). At most 2.5.
//   - control/cli-vs-pair: one CLI process per operation (`crustctl direct-volume add` and `remove`, the
//     drop-in for `kata-runtime direct-volume`, what a driver written in shell pays) over crust's pair on
//     tmpfs. At least 50.
//   - control/throughput-8-vs-kata-lib and -32-: pairs a second from 8 and 32 concurrent clients, each on
//     volumes of its own, over the Kata library's pairs a second from as many goroutines. At least 0.35.
func BenchmarkPair(b *testing.B) {
	ctx := context.Background()
	tmpfs := dirOn(b, tmpfsMagic, "tmpfs")
	ext4 := dirOn(b, ext4Magic, "ext4")
	fast := startEnv(b, tmpfs+"/state", tmpfs+"/kata", concurrentPairs)
	durable := startEnv(b, ext4+"/state", tmpfs+"/kata-ext4", concurrentPairsExt4)
	lib := kataLib{root: tmpfs + "/kata-lib"}
	floor := newDurableFloor(b, ext4, recordSize(b, fast))
	cliKata := tmpfs + "/kata-cli"

	crustPair := func(e *env, spec *crustv1.VolumeSpec) {
		e.stage(ctx, b, spec)
		e.unstage(ctx, b, spec)
	}
	var vsLib, vsFloor, cli, tp8, tp32, pairUs, libUs, floorUs, ext4Scale []float64
	round := 0
	for b.Loop() {
		first := round%2 == 0
		round++
		c, k := sideBySide(first,
			func() time.Duration { return timeEach(tmpfsPairs, func(i int) { crustPair(fast, fast.specs[i]) }) },
			func() time.Duration { return timeEach(tmpfsPairs, func(i int) { lib.pair(b, fast.specs[i]) }) })
		vsLib, pairUs, libUs = append(vsLib, ratio(c, k)), append(pairUs, us(c)), append(libUs, us(k))
		c, f := sideBySide(first,
			func() time.Duration { return timeEach(ext4Pairs, func(i int) { crustPair(durable, durable.specs[i]) }) },
			func() time.Duration { return timeEach(ext4Pairs, func(i int) { floor.pair(b, i) }) })
		vsFloor, floorUs = append(vsFloor, ratio(c, f)), append(floorUs, us(f))
		c, p := sideBySide(first,
			func() time.Duration { return timeEach(cliPairs, func(i int) { crustPair(fast, fast.specs[i]) }) },
			func() time.Duration { return timeEach(cliPairs, func(i int) { cliPair(b, cliKata, fast.specs[i]) }) })
		cli = append(cli, ratio(p, c))
		for _, tc := range []struct {
			clients int
			into    *[]float64
		}{{8, &tp8}, {32, &tp32}} {
			// Throughput is the inverse of the time per pair: crust's over the library's is the library's
			// time over crust's.
			c, k := sideBySide(first,
				func() time.Duration {
					return concurrently(tc.clients, concurrentPairs, func(i int) { crustPair(fast, fast.specs[i]) })
				},
				func() time.Duration {
					return concurrently(tc.clients, concurrentPairs, func(i int) { lib.pair(b, fast.specs[i]) })
				})
			*tc.into = append(*tc.into, ratio(k, c))
		}
		// On ext4, clients that commit together share directory fsyncs (safedir.Dir.Sync).
		one, eight := sideBySide(first,
			func() time.Duration {
				return concurrently(1, concurrentPairsExt4, func(i int) { crustPair(durable, durable.specs[i]) })
			},
			func() time.Duration {
				return concurrently(8, concurrentPairsExt4, func(i int) { crustPair(durable, durable.specs[i]) })
			})
		ext4Scale = append(ext4Scale, ratio(one, eight))
	}
	b.StopTimer()
	benchfig.Record(b, benchfig.Figure{Name: "control/pair-vs-kata-lib", Unit: "x", Samples: vsLib, Target: benchfig.AtMost(4),
		About: "StageVolume+UnstageVolume over crustd's socket (store and Kata dir on tmpfs) / Kata's direct-volume add+remove in process on tmpfs"})
	benchfig.Record(b, benchfig.Figure{Name: "control/pair-tmpfs", Unit: "us", Samples: pairUs,
		About: "mean time of a StageVolume+UnstageVolume pair, store and Kata dir on tmpfs"})
	benchfig.Record(b, benchfig.Figure{Name: "control/kata-lib-pair-tmpfs", Unit: "us", Samples: libUs,
		About: "mean time of Kata's direct-volume add+remove in process on tmpfs"})
	benchfig.Record(b, benchfig.Figure{Name: "control/durable-floor-pair-ext4", Unit: "us", Samples: floorUs,
		About: "mean time of the durable-write floor's pair on ext4"})
	benchfig.Record(b, benchfig.Figure{Name: "control/pair-vs-durable-floor", Unit: "x", Samples: vsFloor, Target: benchfig.AtMost(2.5),
		About: "the pair with crustd's store on ext4 / temp file, fsync, rename, dir fsync; unlink, dir fsync on that ext4"})
	benchfig.Record(b, benchfig.Figure{Name: "control/cli-vs-pair", Unit: "x", Samples: cli, Target: benchfig.AtLeast(50),
		About: "a crustctl direct-volume add and remove process per operation / the pair over crustd's socket (tmpfs)"})
	benchfig.Record(b, benchfig.Figure{Name: "control/throughput-8-vs-kata-lib", Unit: "x", Samples: tp8, Target: benchfig.AtLeast(0.35),
		About: "pairs a second from 8 concurrent clients / the Kata library's from 8 goroutines (tmpfs)"})
	benchfig.Record(b, benchfig.Figure{Name: "control/throughput-32-vs-kata-lib", Unit: "x", Samples: tp32, Target: benchfig.AtLeast(0.35),
		About: "pairs a second from 32 concurrent clients / the Kata library's from 32 goroutines (tmpfs)"})
	benchfig.Record(b, benchfig.Figure{Name: "control/throughput-8-vs-1-ext4", Unit: "x", Samples: ext4Scale,
		About: "pairs a second from 8 concurrent clients / from 1, crustd's store on ext4 (directory fsyncs shared)"})
}

// sideBySide runs crust and other, crust first when crustFirst, and returns their times.
func sideBySide(crustFirst bool, crust, other func() time.Duration) (c, o time.Duration) {
	if crustFirst {
		c, o = crust(), other()
	} else {
		o, c = other(), crust()
	}
	return c, o
}

// concurrently runs total ops from n goroutines, goroutine g taking ops g, g+n, g+2n..., and returns the
// wall time per op.
func concurrently(n, total int, op func(i int)) time.Duration {
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := range n {
		wg.Go(func() {
			for i := g; i < total; i += n {
				op(i)
			}
		})
	}
	wg.Wait()
	return time.Since(t0) / time.Duration(total)
}

// cliPair adds and removes the volume of spec with one crustctl direct-volume process each.
func cliPair(b *testing.B, kataDir string, spec *crustv1.VolumeSpec) {
	mi, err := json.Marshal(kataMountInfo{VolumeType: "directvol", Device: spec.GetVolumeBackingPath(), FsType: spec.GetFsType()})
	if err != nil {
		b.Fatal(err)
	}
	for _, args := range [][]string{
		{"direct-volume", "add", "--kata-dir", kataDir, "--volume-path", spec.GetVolumeTargetPath(), "--mount-info", string(mi)},
		{"direct-volume", "remove", "--kata-dir", kataDir, "--volume-path", spec.GetVolumeTargetPath()},
	} {
		if out, err := exec.Command(bins.crustctl, args...).CombinedOutput(); err != nil {
			b.Fatalf("crustctl %v: %v\n%s", args, err, out)
		}
	}
}

// recordSize is the size of the store record of a staged volume of e, for the durable floor to write as
// much.
func recordSize(b *testing.B, e *env) int {
	b.Helper()
	v, err := e.vols.StageVolume(context.Background(), &crustv1.StageVolumeRequest{Spec: e.specs[0]})
	if err != nil {
		b.Fatal(err)
	}
	e.unstage(context.Background(), b, e.specs[0])
	// The record holds the volume's protojson encoding and an envelope of about 150 bytes.
	return len(mustJSON(b, v.GetVolume())) + 150
}
