package control

import (
	"testing"

	"crust.dev/crust/internal/testutil/benchfig"
)

// figures are the figures this package records, by name: what each compares, in its unit, and the target
// its median must reach (none: reported as measured). docs/performance.md explains them.
var figures = map[string]benchfig.Figure{
	"control/pair-vs-kata-lib": {Unit: "x", Target: benchfig.AtMost(4),
		About: "StageVolume+UnstageVolume over crustd's socket (store and Kata dir on tmpfs) / Kata's direct-volume add+remove in process on tmpfs"},
	"control/crustd-rtt": {Unit: "us",
		About: "an empty unary round trip to crustd's process (its health service), from the driver's side"},
	"control/pair-vs-2-crustd-rtt": {Unit: "x",
		About: "the pair (tmpfs) / two empty round trips to crustd: what crustd's own work adds to the floor of any daemon"},
	"control/bare-grpc-rtt": {Unit: "us",
		About: "an empty unary round trip to a process serving gRPC's health service alone (grpc-go with crustd's stream workers, no interceptors): the least a call to a daemon reached over gRPC costs here"},
	"control/crustd-rtt-vs-bare": {Unit: "x",
		About: "an empty round trip to crustd / to that process: what crustd's server (credentials, call log, metrics) adds to a call"},
	"control/2-bare-rtt-vs-kata-lib": {Unit: "x",
		About: "two empty round trips to that process / Kata's direct-volume add+remove in process: the lowest pair-vs-kata-lib any daemon reached over gRPC can have here"},
	"control/cli-vs-2-bare-rtt": {Unit: "x",
		About: "a crustctl direct-volume add and remove process per operation / two empty round trips to that process: the highest cli-vs-pair any daemon reached over gRPC can have here"},
	"control/pair-tmpfs": {Unit: "us",
		About: "mean time of a StageVolume+UnstageVolume pair, store and Kata dir on tmpfs"},
	"control/kata-lib-pair-tmpfs": {Unit: "us",
		About: "mean time of Kata's direct-volume add+remove in process on tmpfs"},
	"control/durable-floor-pair-ext4": {Unit: "us",
		About: "mean time of the durable-write floor's pair on ext4"},
	"control/pair-vs-durable-floor": {Unit: "x", Target: benchfig.AtMost(2.5),
		About: "the pair with crustd's store on ext4 / temp file, fsync, rename, dir fsync; unlink, dir fsync on that ext4"},
	"control/cli-vs-pair": {Unit: "x", Target: benchfig.AtLeast(50),
		About: "a crustctl direct-volume add and remove process per operation / the pair over crustd's socket (tmpfs)"},
	"control/throughput-8-vs-kata-lib": {Unit: "x", Target: benchfig.AtLeast(0.35),
		About: "pairs a second from 8 concurrent clients / the Kata library's from 8 goroutines (tmpfs)"},
	"control/throughput-32-vs-kata-lib": {Unit: "x", Target: benchfig.AtLeast(0.35),
		About: "pairs a second from 32 concurrent clients / the Kata library's from 32 goroutines (tmpfs)"},
	"control/throughput-8-ceiling-vs-kata-lib": {Unit: "x",
		About: "two empty round trips to crustd's process a second from 8 concurrent clients / the Kata library's pairs a second: the most a daemon reached over gRPC could reach here"},
	"control/throughput-32-ceiling-vs-kata-lib": {Unit: "x",
		About: "the same ceiling from 32 concurrent clients"},
	"control/throughput-8-vs-ceiling": {Unit: "x",
		About: "crust's pairs a second from 8 concurrent clients / two empty round trips a second from as many (the ceiling)"},
	"control/throughput-32-vs-ceiling": {Unit: "x",
		About: "the same from 32 concurrent clients"},
	"control/throughput-8-lib-ceiling-vs-kata-lib": {Unit: "x",
		About: "two empty round trips to crustd's process and the Kata library's add+remove in the client, from 8 concurrent clients / the library's pairs a second: the most a daemon reached over gRPC that writes Kata's files as the library does could reach here"},
	"control/throughput-32-lib-ceiling-vs-kata-lib": {Unit: "x",
		About: "the same from 32 concurrent clients"},
	"control/throughput-8-vs-1-ext4": {Unit: "x",
		About: "pairs a second from 8 concurrent clients / from 1, crustd's store on ext4 (directory fsyncs shared)"},
	"control/stats-added-vs-rtt": {Unit: "x", Target: benchfig.AtMost(1.3),
		About: "(GetVolumeStats on crustd, forwarded to the handler) minus one round trip to another process (what the straight call would cost: an empty call to crustd's health service, call by call in turns) / that round trip"},
	"control/expand-added-vs-rtt": {Unit: "x", Target: benchfig.AtMost(1.3),
		About: "(ExpandVolume on crustd, forwarded to the handler) minus one round trip to another process / that round trip"},
	"control/unary-rtt": {Unit: "us",
		About: "one unary round trip within one process: GetVolumeStats straight to a handler answering from constants"},
	"scale/pair-p50-10k-vs-0": {Unit: "x", Target: benchfig.AtMost(1.1),
		About: "median StageVolume+UnstageVolume with 10,000 descriptors held / with none"},
	"scale/rss-10k": {Unit: "MiB", Target: benchfig.AtMost(48),
		About: "crustd's resident memory holding 10,000 descriptors, after the round's calls"},
	"scale/restart-10k": {Unit: "s", Target: benchfig.AtMost(0.3),
		About: "crustd's start over 10,000 records to serving (its start_took)"},
	"scale/list-per-item-100k-vs-10k": {Unit: "x", Target: benchfig.AtMost(1.2),
		About: "time per descriptor listing 100,000 (every ListVolumes page) / listing 10,000"},
}

// record records samples as the figure name of the table above.
func record(b *testing.B, name string, samples []float64) {
	b.Helper()
	f, ok := figures[name]
	if !ok {
		b.Fatalf("figure %s is not in the table", name)
	}
	f.Name, f.Samples = name, samples
	benchfig.Record(b, f)
}
