package control

import (
	"context"
	"path/filepath"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/internal/testutil/sandbox"
)

// forwardCalls is how many calls of each kind a round of BenchmarkForward makes.
const forwardCalls = 300

// fixedHandler answers stats and expansion with the same answers every time, so that a call to it costs
// one round trip.
type fixedHandler struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer
	stats  *crustv1.RuntimeHandlerServiceGetVolumeStatsResponse
	expand *crustv1.RuntimeHandlerServiceExpandVolumeResponse
}

func (h fixedHandler) GetVolumeStats(context.Context, *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	return h.stats, nil
}

func (h fixedHandler) ExpandVolume(context.Context, *crustv1.RuntimeHandlerServiceExpandVolumeRequest) (*crustv1.RuntimeHandlerServiceExpandVolumeResponse, error) {
	return h.expand, nil
}

// BenchmarkForward measures what crustd adds to a claimed volume's stats and expansion, which it forwards
// to the runtime handler that claimed the volume, one round an op (run it with -benchtime 9x). A driver
// that could call the handler straight would pay one round trip to another process; per round, the call
// through crustd is timed side by side with an empty round trip to another process on the same kind of
// socket (crustd's health service), call by call in turns, so that a drift in the machine's speed falls on
// both sides alike. Figures: control/stats-added-vs-rtt and
// control/expand-added-vs-rtt, (through crustd − that round trip) / that round trip, at most 1.3 each;
// control/unary-rtt, the straight call to the handler within this process, for scale.
func BenchmarkForward(b *testing.B) {
	ctx := context.Background()
	tmpfs := dirOn(b, tmpfsMagic, "tmpfs")
	e := startEnv(b, tmpfs+"/state", tmpfs+"/kata", 1)
	spec := e.specs[0]
	target := spec.GetVolumeTargetPath()
	e.stage(ctx, b, spec)
	rt, endpoint, _ := sandbox.Serve(b, e.d.Socket, filepath.Join(e.d.Root, "run", "handler.sock"), fixedHandler{
		stats:  &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{{Unit: crustv1.VolumeUsage_UNIT_BYTES, Total: 64 << 20}}},
		expand: &crustv1.RuntimeHandlerServiceExpandVolumeResponse{CapacityBytes: 64 << 20},
	})
	if _, err := rt.Claim(ctx, target, "bench-sandbox", endpoint); err != nil {
		b.Fatal(err)
	}
	hconn, err := unixsocket.Dial(endpoint, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = hconn.Close() })
	direct := crustv1.NewRuntimeHandlerServiceClient(hconn)

	viaStats := func(int) {
		if _, err := e.vols.GetVolumeStats(ctx, &crustv1.GetVolumeStatsRequest{VolumeTargetPath: target}); err != nil {
			b.Fatal(err)
		}
	}
	directStats := func(int) {
		if _, err := direct.GetVolumeStats(ctx, &crustv1.RuntimeHandlerServiceGetVolumeStatsRequest{VolumeTargetPath: target, SandboxId: "bench-sandbox"}); err != nil {
			b.Fatal(err)
		}
	}
	viaExpand := func(int) {
		if _, err := e.vols.ExpandVolume(ctx, &crustv1.ExpandVolumeRequest{VolumeTargetPath: target, RequiredBytes: 64 << 20}); err != nil {
			b.Fatal(err)
		}
	}
	crossRTT := func(int) {
		if _, err := e.health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	var stats, expand, rtt []float64
	round := 0
	for b.Loop() {
		first := round%2 == 0
		round++
		// A handler is a process of its own: the straight call costs one round trip to another process,
		// measured here as an empty call to crustd's health service, in the same round.
		v, x := inTurns(first, forwardCalls, viaStats, crossRTT)
		stats, rtt = append(stats, ratio(v-x, x)), append(rtt, us(timeEach(forwardCalls, directStats)))
		v, x = inTurns(first, forwardCalls, viaExpand, crossRTT)
		expand = append(expand, ratio(v-x, x))
	}
	b.StopTimer()
	record(b, "control/stats-added-vs-rtt", stats)
	record(b, "control/expand-added-vs-rtt", expand)
	record(b, "control/unary-rtt", rtt)
}
