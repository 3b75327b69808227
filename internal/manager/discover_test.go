package manager

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/crisandbox"
	"crust.dev/crust/internal/forward"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/critest"
)

// kataNode is an env whose manager finds Kata sandboxes through a real CRI gRPC server (critest, on a
// unix socket) and the Kata shim directories, and forwards to Kata shims there; the volume at target(0),
// in pod "pod-0", is a real loop device.
type kataNode struct {
	*env
	cri           *critest.Server
	goDir, rsDir  string
	tp, dev       string
	finderTimeout time.Duration
}

func newKataNode(t *testing.T, criEndpoint string) *kataNode {
	t.Helper()
	e := newEnv(t)
	root := testutil.SocketDir(t)
	n := &kataNode{env: e, goDir: filepath.Join(root, "sbs"), rsDir: filepath.Join(root, "kata"), finderTimeout: 300 * time.Millisecond}
	n.cri = (&critest.Server{}).Start(t, filepath.Join(root, "cri.sock"))
	if criEndpoint == "" {
		criEndpoint = n.cri.Endpoint()
	}
	finder, err := crisandbox.New(crisandbox.Config{Endpoint: criEndpoint, ShimDirs: []string{n.goDir, n.rsDir}, Timeout: n.finderTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = finder.Close() })
	e.sandboxes = finder
	e.fwd = &forward.Forwarder{KataShimDirs: []string{n.goDir, n.rsDir}}
	n.dev, _ = e.stageLoop(e.spec(0, 0), 8<<20)
	n.tp = e.target(0)
	return n
}

// runtimeRS starts a stand-in runtime-rs shim for sandbox id (stats on POST only) that answers for the
// node's device with bytes used, and lists the sandbox as ready in pod-0.
func (n *kataNode) runtimeRS(t *testing.T, id string, used uint64) *katatest.Shim {
	t.Helper()
	return (&katatest.Shim{StatsPostOnly: true, Stats: func(device string) (*katatest.VolumeStats, error) {
		if device != n.dev {
			return nil, errors.New("no volume with device " + device)
		}
		return &katatest.VolumeStats{Usage: []katatest.VolumeUsage{{Total: 8 << 20, Used: used, Available: 8<<20 - used, Unit: 1}}}, nil
	}}).Start(t, katatest.ShimSocket(n.rsDir, id))
}

func wantHostAnswer(t *testing.T, st *crustv1.GetVolumeStatsResponse, err error) {
	t.Helper()
	if err != nil || st.GetVolumeCondition().GetMessage() != NotMountedMessage {
		t.Fatalf("stats = %v, %v; want the host's answer (%q)", st, err, NotMountedMessage)
	}
}

// TestDiscoverKataClaim: a volume no sandbox-id file names, of a pod whose ready sandbox is served by a
// runtime-rs shim, gets that sandbox as its claim at the first stats (kata, cri_discovered, durable, a
// CLAIMED event), and the stats are the shim's, asked by POST. The claim blocks another sandbox, on the
// target and on the device through another target, and `release --force` ends it.
func TestDiscoverKataClaim(t *testing.T) {
	n := newKataNode(t, "")
	ctx := context.Background()
	shim := n.runtimeRS(t, "rs-sandbox", 3<<20)
	n.cri.Set(critest.Sandbox("rs-sandbox", "pod-0", true), critest.Sandbox("old-sandbox", "pod-0", false),
		critest.Sandbox("other-pod", "pod-1", true))
	w := n.m.Watch(false)
	defer w.Stop()

	st, err := n.m.Stats(ctx, n.tp)
	if err != nil {
		t.Fatal(err)
	}
	want := &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Total: 8 << 20, Used: 3 << 20, Available: 5 << 20, Unit: crustv1.VolumeUsage_UNIT_BYTES}}}
	if !proto.Equal(st, want) {
		t.Fatalf("stats = %v, want the shim's %v", st, want)
	}
	if reqs := shim.Requests(); len(reqs) == 0 || reqs[len(reqs)-1].Method != "POST" {
		t.Fatalf("the shim got %+v, want stats by POST", reqs)
	}
	ev := <-w.Events()
	if ev.GetType() != crustv1.EventType_EVENT_TYPE_CLAIMED {
		t.Fatalf("event %v, want CLAIMED", ev)
	}
	wantClaim := func(step string, v *crustv1.Volume) {
		t.Helper()
		c := v.GetClaim()
		if c.GetSandboxId() != "rs-sandbox" || !c.GetKata() || !c.GetCriDiscovered() || c.GetClaimTime() == nil || c.GetHandlerEndpoint() != "" {
			t.Fatalf("%s: claim %v, want rs-sandbox, kata, cri_discovered", step, c)
		}
	}
	wantClaim("event", ev.GetVolume())
	n.reopen() // durable
	v, err := n.m.Get(ctx, n.tp)
	if err != nil {
		t.Fatal(err)
	}
	wantClaim("after a restart", v)
	if _, err := os.Stat(filepath.Join(n.kataDir, kata.VolumeDirName(n.tp), "rs-sandbox")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a sandbox-id file was written: %v", err)
	}

	// One writer: another sandbox, on this target or on the same device through another.
	if _, err := n.m.Claim(ctx, n.tp, "intruder", "unix:///run/h.sock"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a second sandbox's claim: %v, want FailedPrecondition", err)
	}
	spec := n.spec(1, 0)
	spec.VolumeBackingPath = n.dev
	if _, err := n.m.Stage(ctx, spec); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "rs-sandbox") {
		t.Fatalf("a deposit of the device through another target: %v, want FailedPrecondition naming rs-sandbox", err)
	}

	// Expansion goes to the shim too (a real Kata answers UNIMPLEMENTED).
	if _, err := n.m.Expand(ctx, n.tp, 8<<20, 0); !errors.Is(err, errdefs.ErrUnimplemented) {
		t.Fatalf("expand: %v, want the shim's UNIMPLEMENTED", err)
	}

	// release --force.
	w2 := n.m.Watch(false)
	defer w2.Stop()
	if err := n.m.Release(ctx, n.tp, "", true); err != nil {
		t.Fatal(err)
	}
	if ev := <-w2.Events(); ev.GetType() != crustv1.EventType_EVENT_TYPE_RELEASED || ev.GetReleaseReason() != crustv1.ReleaseReason_RELEASE_REASON_FORCED ||
		!ev.GetReleasedClaim().GetCriDiscovered() {
		t.Fatalf("event %v, want RELEASED, FORCED, the discovered claim", ev)
	}
	if v, _ := n.m.Get(ctx, n.tp); v.GetClaim() != nil {
		t.Fatalf("claim after release --force: %v", v.GetClaim())
	}
}

// TestDiscoverExpand: expansion of a volume nothing claims finds the sandbox too, and asks its shim.
func TestDiscoverExpand(t *testing.T) {
	n := newKataNode(t, "")
	var resized []uint64
	(&katatest.Shim{StatsPostOnly: true, Resize: func(_ string, size uint64) error { resized = append(resized, size); return nil }}).
		Start(t, katatest.ShimSocket(n.rsDir, "rs-sandbox"))
	n.cri.Set(critest.Sandbox("rs-sandbox", "pod-0", true))
	if got, err := n.m.Expand(context.Background(), n.tp, 8<<20, 0); err != nil || got != 8<<20 {
		t.Fatalf("expand = %d, %v", got, err)
	}
	if len(resized) != 1 || resized[0] != 8<<20 {
		t.Fatalf("the shim resized %v", resized)
	}
}

// TestDiscoverNothing: no claim is recorded, and stats answer from the host as before, when the pod has
// no sandbox served by a Kata shim, two of them (which one uses the volume cannot be told), or its
// sandbox is not ready; and when a sandbox-id file names the sandbox, that one is the claim and the
// runtime is not asked.
func TestDiscoverNothing(t *testing.T) {
	n := newKataNode(t, "")
	ctx := context.Background()
	n.runtimeRS(t, "sb-a", 1)
	n.runtimeRS(t, "sb-b", 1)
	for _, tc := range []struct {
		name      string
		sandboxes []string // ready ones of pod-0
	}{
		{"no sandbox", nil},
		{"a sandbox without a Kata shim", []string{"runc-sandbox"}},
		{"two Kata sandboxes", []string{"sb-a", "sb-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sbs []*runtimeapi.PodSandbox
			for _, id := range tc.sandboxes {
				sbs = append(sbs, critest.Sandbox(id, "pod-0", true))
			}
			sbs = append(sbs, critest.Sandbox("sb-a-stopped", "pod-0", false))
			n.cri.Set(sbs...)
			before := n.cri.Calls()
			st, err := n.m.Stats(ctx, n.tp)
			wantHostAnswer(t, st, err)
			if n.cri.Calls() == before {
				t.Error("the runtime was not asked")
			}
			if v, _ := n.m.Get(ctx, n.tp); v.GetClaim() != nil {
				t.Fatalf("claim %v", v.GetClaim())
			}
		})
	}
	t.Run("a sandbox-id file", func(t *testing.T) {
		n.cri.Set(critest.Sandbox("sb-a", "pod-0", true))
		if err := katatest.RecordSandbox(n.kataDir, n.tp, "sb-b"); err != nil {
			t.Fatal(err)
		}
		before := n.cri.Calls()
		st, err := n.m.Stats(ctx, n.tp)
		if err != nil || len(st.GetUsage()) != 1 || st.GetUsage()[0].GetUsed() != 1 {
			t.Fatalf("stats = %v, %v; want sb-b's shim's", st, err)
		}
		if n.cri.Calls() != before {
			t.Error("the runtime was asked although a sandbox-id file names the sandbox")
		}
		if c, _ := n.m.Get(ctx, n.tp); c.GetClaim().GetSandboxId() != "sb-b" || c.GetClaim().GetCriDiscovered() {
			t.Fatalf("claim %v, want sb-b's from its file", c.GetClaim())
		}
		if found := n.k.FindAll(ctx); len(found) != 0 {
			t.Fatalf("periodic discovery recorded %q", found)
		}
	})
}

// TestDiscoverWithoutRuntime: with no CRI socket, or one that never answers, stats answer from the host
// as before, within the finder's timeout, and nothing is recorded.
func TestDiscoverWithoutRuntime(t *testing.T) {
	root := testutil.SocketDir(t)
	testutil.Listen(t, filepath.Join(root, "mute.sock"))
	for name, ep := range map[string]string{
		"no socket":     "unix://" + filepath.Join(root, "none.sock"),
		"never answers": "unix://" + filepath.Join(root, "mute.sock"),
	} {
		t.Run(name, func(t *testing.T) {
			n := newKataNode(t, ep)
			n.runtimeRS(t, "rs-sandbox", 1)
			t0 := time.Now()
			st, err := n.m.Stats(context.Background(), n.tp)
			wantHostAnswer(t, st, err)
			if d := time.Since(t0); d > n.finderTimeout+2*time.Second {
				t.Errorf("stats took %s with a runtime that does not answer; the timeout is %s", d, n.finderTimeout)
			}
			if v, _ := n.m.Get(context.Background(), n.tp); v.GetClaim() != nil {
				t.Fatalf("claim %v", v.GetClaim())
			}
		})
	}
}

// TestDiscoverKataClaims: the periodic pass asks the runtime once for every unclaimed volume, records
// the claims it finds, and asks nothing when no volume is unclaimed.
func TestDiscoverKataClaims(t *testing.T) {
	n := newKataNode(t, "")
	ctx := context.Background()
	n.runtimeRS(t, "sb-0", 1)
	n.runtimeRS(t, "sb-1", 1)
	spec := n.spec(1, 1) // in pod-1
	if _, err := n.m.Stage(ctx, spec); err != nil {
		t.Fatal(err)
	}
	spec = n.spec(5, 2) // in pod-1 too, whose sandbox is not ready yet below
	if _, err := n.m.Stage(ctx, spec); err != nil {
		t.Fatal(err)
	}
	n.cri.Set(critest.Sandbox("sb-0", "pod-0", true), critest.Sandbox("sb-1", "pod-1", false))
	before := n.cri.Calls()
	if got := n.k.FindAll(ctx); !slices.Equal(got, []string{n.tp}) {
		t.Fatalf("found %q, want %q", got, n.tp)
	}
	if calls := n.cri.Calls() - before; calls != 1 {
		t.Errorf("%d calls to the runtime for three volumes, want 1", calls)
	}
	n.cri.Set(critest.Sandbox("sb-0", "pod-0", true), critest.Sandbox("sb-1", "pod-1", true))
	got := n.k.FindAll(ctx)
	slices.Sort(got)
	if want := []string{n.target(1), n.target(5)}; !slices.Equal(got, want) {
		t.Fatalf("found %q, want %q", got, want)
	}
	for _, tp := range []string{n.tp, n.target(1), n.target(5)} {
		if v, _ := n.m.Get(ctx, tp); !v.GetClaim().GetCriDiscovered() {
			t.Errorf("%s: claim %v", tp, v.GetClaim())
		}
	}
	before = n.cri.Calls()
	if got := n.k.FindAll(ctx); len(got) != 0 || n.cri.Calls() != before {
		t.Errorf("with every volume claimed: found %q, %d calls to the runtime", got, n.cri.Calls()-before)
	}
}

// TestDiscoverSkipsRawBlock: a raw block volume has no Kata projection, so no Kata runtime takes it from
// crust and the Kata sandbox of its pod is not recorded as its claim; the runtime is not even asked.
func TestDiscoverSkipsRawBlock(t *testing.T) {
	n := newKataNode(t, "")
	ctx := context.Background()
	n.runtimeRS(t, "sb-a", 1)
	n.cri.Set(critest.Sandbox("sb-a", "pod-0", true))
	if _, err := n.m.Unstage(ctx, n.tp); err != nil {
		t.Fatal(err)
	}
	spec := n.spec(0, 0)
	spec.VolumeBackingPath, spec.VolumeMode, spec.FsType, spec.MountFlags = n.dev, crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", nil
	if _, err := n.m.Stage(ctx, spec); err != nil {
		t.Fatal(err)
	}
	before := n.cri.Calls()
	if _, err := n.m.Stats(ctx, n.tp); err != nil {
		t.Fatal(err)
	}
	if found := n.k.FindAll(ctx); len(found) != 0 {
		t.Errorf("periodic discovery recorded %q", found)
	}
	if v, _ := n.m.Get(ctx, n.tp); v.GetClaim() != nil {
		t.Errorf("claim %v on a raw block volume", v.GetClaim())
	}
	if n.cri.Calls() != before {
		t.Error("the runtime was asked for a raw block volume")
	}
}
