package control

import (
	"context"
	"encoding/json"
	"os/exec"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
)

// Pairs per round of each side.
const (
	tmpfsPairs = 200 // crust and the Kata library, on tmpfs
	ext4Pairs  = 150 // crust and the durable floor, on ext4, in turns
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
//   - control/bare-grpc-rtt: an empty round trip to grpcfloor, a process serving gRPC's health service
//     alone as crustd's server would without its interceptors, measured beside crustd's
//     (control/crustd-rtt); control/crustd-rtt-vs-bare, what crustd's server adds to an empty call. Two
//     bare round trips over the library's pair, control/2-bare-rtt-vs-kata-lib, are the lowest
//     pair-vs-kata-lib any daemon reached over gRPC can have on the machine; the CLI's time over them,
//     control/cli-vs-2-bare-rtt, the highest cli-vs-pair.
//   - control/throughput-8-vs-kata-lib and -32-: pairs a second from 8 and 32 concurrent clients, each on
//     volumes of its own, over the Kata library's pairs a second from as many goroutines. At least 0.35.
//     Its ceiling, measured in the same round: control/throughput-8-ceiling-vs-kata-lib and -32-, the
//     same clients making two empty round trips to crustd's process (its health service) instead of a
//     pair, which is what the fastest daemon reached over gRPC would do; and control/throughput-8-vs-ceiling
//     and -32-, crust's pairs a second over those. A daemon must also write Kata's files: the same
//     clients making the two empty round trips and then the library's own pair, in process, are the
//     most a daemon reached over gRPC that does the library's work could reach
//     (control/throughput-8-lib-ceiling-vs-kata-lib and -32-); on two cores the CPU of both adds up.
func BenchmarkPair(b *testing.B) {
	ctx := context.Background()
	tmpfs := dirOn(b, tmpfsMagic, "tmpfs")
	ext4 := dirOn(b, ext4Magic, "ext4")
	fast := startEnv(b, tmpfs+"/state", tmpfs+"/kata", concurrentPairs)
	durable := startEnv(b, ext4+"/state", tmpfs+"/kata-ext4", concurrentPairsExt4)
	lib := kataLib{root: tmpfs + "/kata-lib"}
	floor := newDurableFloor(b, ext4, recordSize(b, fast))
	cliKata := tmpfs + "/kata-cli"

	bare := startGRPCFloor(b)

	crustPair := func(e *env, spec *crustv1.VolumeSpec) {
		e.stage(ctx, b, spec)
		e.unstage(ctx, b, spec)
	}
	// emptyPairOn makes two empty calls to h, as many as a pair makes.
	emptyPairOn := func(h healthpb.HealthClient) {
		for range 2 {
			if _, err := h.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	emptyPair := func() { emptyPairOn(fast.health) }
	var vsLib, vsFloor, cli, pairUs, libUs, floorUs, ext4Scale, crustdRTT, vsRTT []float64
	var bareRTT, crustdVsBare, bareVsLib, cliVsBare []float64
	var tp8, tp32, ceil8, ceil32, vsCeil8, vsCeil32, libCeil8, libCeil32 []float64
	round := 0
	for b.Loop() {
		first := round%2 == 0
		round++
		c, k := sideBySide(first,
			func() time.Duration { return timeEach(tmpfsPairs, func(i int) { crustPair(fast, fast.specs[i]) }) },
			func() time.Duration { return timeEach(tmpfsPairs, func(i int) { lib.pair(b, fast.specs[i]) }) })
		vsLib, pairUs, libUs = append(vsLib, ratio(c, k)), append(pairUs, us(c)), append(libUs, us(k))
		// Just after, two empty round trips to crustd's process (the pair without crustd's own work) and to
		// a process serving nothing but the health service (the floor of any daemon reached over gRPC).
		rtt, floorRTT := sideBySide(first,
			func() time.Duration { return timeEach(tmpfsPairs, func(int) { emptyPair() }) / 2 },
			func() time.Duration { return timeEach(tmpfsPairs, func(int) { emptyPairOn(bare) }) / 2 })
		crustdRTT, vsRTT = append(crustdRTT, us(rtt)), append(vsRTT, ratio(c, 2*rtt))
		bareRTT, crustdVsBare = append(bareRTT, us(floorRTT)), append(crustdVsBare, ratio(rtt, floorRTT))
		bareVsLib = append(bareVsLib, ratio(2*floorRTT, k))
		// An fsync's cost on ext4 drifts over seconds: the two sides take turns pair by pair.
		c, f := inTurns(first, ext4Pairs,
			func(i int) { crustPair(durable, durable.specs[i]) }, func(i int) { floor.pair(b, i) })
		vsFloor, floorUs = append(vsFloor, ratio(c, f)), append(floorUs, us(f))
		c, p := sideBySide(first,
			func() time.Duration { return timeEach(cliPairs, func(i int) { crustPair(fast, fast.specs[i]) }) },
			func() time.Duration { return timeEach(cliPairs, func(i int) { cliPair(b, cliKata, fast.specs[i]) }) })
		cli, cliVsBare = append(cli, ratio(p, c)), append(cliVsBare, ratio(p, 2*floorRTT))
		for _, tc := range []struct {
			clients                      int
			vsLib, ceil, vsCeil, libCeil *[]float64
		}{{8, &tp8, &ceil8, &vsCeil8, &libCeil8}, {32, &tp32, &ceil32, &vsCeil32, &libCeil32}} {
			// Throughput is the inverse of the time per pair: crust's over the library's is the library's
			// time over crust's.
			c, k := sideBySide(first,
				func() time.Duration {
					return concurrently(tc.clients, concurrentPairs, func(i int) { crustPair(fast, fast.specs[i]) })
				},
				func() time.Duration {
					return concurrently(tc.clients, concurrentPairs, func(i int) { lib.pair(b, fast.specs[i]) })
				})
			e := concurrently(tc.clients, concurrentPairs, func(int) { emptyPair() })
			w := concurrently(tc.clients, concurrentPairs, func(i int) { emptyPair(); lib.pair(b, fast.specs[i]) })
			*tc.vsLib, *tc.ceil, *tc.vsCeil = append(*tc.vsLib, ratio(k, c)), append(*tc.ceil, ratio(k, e)), append(*tc.vsCeil, ratio(e, c))
			*tc.libCeil = append(*tc.libCeil, ratio(k, w))
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
	record(b, "control/pair-vs-kata-lib", vsLib)
	record(b, "control/pair-tmpfs", pairUs)
	record(b, "control/crustd-rtt", crustdRTT)
	record(b, "control/pair-vs-2-crustd-rtt", vsRTT)
	record(b, "control/bare-grpc-rtt", bareRTT)
	record(b, "control/crustd-rtt-vs-bare", crustdVsBare)
	record(b, "control/2-bare-rtt-vs-kata-lib", bareVsLib)
	record(b, "control/cli-vs-2-bare-rtt", cliVsBare)
	record(b, "control/kata-lib-pair-tmpfs", libUs)
	record(b, "control/durable-floor-pair-ext4", floorUs)
	record(b, "control/pair-vs-durable-floor", vsFloor)
	record(b, "control/cli-vs-pair", cli)
	record(b, "control/throughput-8-vs-kata-lib", tp8)
	record(b, "control/throughput-32-vs-kata-lib", tp32)
	record(b, "control/throughput-8-ceiling-vs-kata-lib", ceil8)
	record(b, "control/throughput-32-ceiling-vs-kata-lib", ceil32)
	record(b, "control/throughput-8-vs-ceiling", vsCeil8)
	record(b, "control/throughput-32-vs-ceiling", vsCeil32)
	record(b, "control/throughput-8-lib-ceiling-vs-kata-lib", libCeil8)
	record(b, "control/throughput-32-lib-ceiling-vs-kata-lib", libCeil32)
	record(b, "control/throughput-8-vs-1-ext4", ext4Scale)
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

// inTurns runs n ops of crust and n of other in turns, crust's first when crustFirst, and returns the
// mean time of one of each.
func inTurns(crustFirst bool, n int, crust, other func(i int)) (c, o time.Duration) {
	timed := func(op func(int), i int) time.Duration {
		t0 := time.Now()
		op(i)
		return time.Since(t0)
	}
	for i := range n {
		if crustFirst == (i%2 == 0) {
			c += timed(crust, i)
			o += timed(other, i)
		} else {
			o += timed(other, i)
			c += timed(crust, i)
		}
	}
	return c / time.Duration(n), o / time.Duration(n)
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
	mi, err := json.Marshal(kata.MountInfo{VolumeType: kata.VolumeTypeDirect, Device: spec.GetVolumeBackingPath(), FsType: spec.GetFsType()})
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
