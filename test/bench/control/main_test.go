// Package control benchmarks crustd's control path against its floors, side by side in one run: each op
// of a benchmark is one round that measures crust and what it is compared with, alternating which goes
// first, and each figure is the spread of a per-round ratio (internal/testutil/benchfig). No VM and no
// root are needed: volumes are image files (VOLUME_TYPE_FILE), crustd runs as a process of its own on a
// unix socket, its state directory on tmpfs or on ext4 as each figure says, its Kata directory on tmpfs
// (where /run puts it on a node).
//
//   - BenchmarkPair: a StageVolume+UnstageVolume pair against an in-process equivalent of Kata's
//     direct-volume library on tmpfs, against a durable-write floor on ext4, and against one CLI process
//     per operation; and pairs from 8 and 32 concurrent clients against the library's throughput.
//
//   - BenchmarkForward: the time crustd adds to a claimed volume's stats and expansion, against one empty
//     unary round trip on the same kind of socket.
//
//   - BenchmarkScale: a pair with 10,000 descriptors held against none, crustd's RSS and restart time with
//     10,000, and listing 100,000 against 10,000.
//
//     go test -run '^$' -bench . -benchtime 9x ./test/bench/control
//
// is what `make bench` runs: nine rounds a figure.
package control

import (
	"os"
	"testing"

	"crust.dev/crust/internal/testutil/benchfig"
)

func TestMain(m *testing.M) {
	os.Exit(benchfig.RunMain(m, "control", "crust.dev/crust/test/bench/control"))
}
