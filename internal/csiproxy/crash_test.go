package csiproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/internal/testutil/harness"
)

// child is a proxy process (this test binary, see TestMain).
type child struct {
	t   testing.TB
	cmd *exec.Cmd
	out *bytes.Buffer
	cc  *grpc.ClientConn
}

// startChild starts a proxy that kills itself at the crash point (never, for the zero one), and waits
// until it serves.
func (e *env) startChild(at crashPoint, pods map[string]Pod) *child {
	e.t.Helper()
	c := e.spawnChild(at, pods)
	ctx, cancel := harness.Context(e.t, 10*time.Second)
	defer cancel()
	if err := harness.WaitCSI(ctx, e.proxySock, nil); err != nil {
		c.stop()
		e.t.Fatalf("child proxy did not serve: %v\n%s", err, c.out)
	}
	var err error
	if c.cc, err = crustd.Dial(e.proxySock); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// spawnChild starts a proxy as startChild does, without waiting for it to serve; c.cc is nil.
func (e *env) spawnChild(at crashPoint, pods map[string]Pod) *child {
	e.t.Helper()
	cfg := e.config()
	cfg.MicroVMHandlers, cfg.NodeName = []string{"kata"}, "n1"
	b, err := json.Marshal(childSpec{Config: cfg, Crash: at, Pods: pods})
	if err != nil {
		e.t.Fatal(err)
	}
	c := &child{t: e.t, out: &bytes.Buffer{}}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (c *child) node() csi.NodeClient { return csi.NewNodeClient(c.cc) }

// close closes the connection to the child, if any.
func (c *child) close() {
	if c.cc != nil {
		_ = c.cc.Close()
	}
}

// killed waits for the child to die of its own SIGKILL.
func (c *child) killed() {
	c.t.Helper()
	c.close()
	err := c.cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		c.t.Fatalf("child ended with %v, want SIGKILL\n%s", err, c.out)
	}
}

// stop ends the child with SIGTERM.
func (c *child) stop() {
	c.close()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// TestCrashRecovery kills the proxy (SIGKILL) right after each step of each call that changes something
// (a journal write, the driver's publish or unpublish, the deposit or host mount and their undoing),
// deferred and host-mounted, restarts it, and checks that kubelet's retry of the same call converges, or
// that kubelet giving up (unpublishing instead) undoes everything; and in every case that nothing leaks
// at the end: no mount (private bind mount, host mount), no descriptor in crustd, no record, no private
// path.
func TestCrashRecovery(t *testing.T) {
	e := newEnv(t)
	pods := map[string]Pod{
		"ns/web": {Namespace: "ns", Name: "web", UID: "0e0e0e0e-0000-4000-8000-0000000000a1"},
		"ns/vm":  {Namespace: "ns", Name: "vm", UID: "0e0e0e0e-0000-4000-8000-0000000000a2", RuntimeClassName: "kata"},
	}
	vol := e.createVolume("pvc-crash", 64<<20, true)
	ctx := context.Background()

	type tc struct {
		op     string // the call that is killed: stage, publish, unpublish, unstage
		mode   Mode
		at     crashPoint
		giveUp bool // after a killed publish or stage, kubelet undoes instead of retrying
	}
	// The instants: after the record that begins the call; after the driver's part (publish) or
	// before it (unpublish: after the deposit or mount is undone); between the last step and the record
	// that ends the call; after that record.
	var cases []tc
	for _, mode := range []Mode{ModeDeferred, ModeHost} {
		for _, at := range []crashPoint{
			{Kind: KindPublish, Phase: PhasePublishing},
			{Method: csi.Node_NodePublishVolume_FullMethodName},
			{Kind: KindPublish, Phase: PhasePublished, Before: true},
			{Kind: KindPublish, Phase: PhasePublished},
		} {
			cases = append(cases, tc{"publish", mode, at, false}, tc{"publish", mode, at, true})
		}
		for _, at := range []crashPoint{
			{Kind: KindPublish, Phase: PhaseUnpublishing},
			{Method: csi.Node_NodeUnpublishVolume_FullMethodName, Before: true},
			{Method: csi.Node_NodeUnpublishVolume_FullMethodName},
			{Kind: KindPublish, Phase: PhaseForgotten},
		} {
			cases = append(cases, tc{"unpublish", mode, at, false})
		}
	}
	for _, ph := range []Phase{PhaseStaging, PhaseStaged} {
		at := crashPoint{Kind: KindStage, Phase: ph}
		cases = append(cases, tc{"stage", ModeDeferred, at, false}, tc{"stage", ModeDeferred, at, true})
	}
	cases = append(cases, tc{"unstage", ModeDeferred, crashPoint{Kind: KindStage, Phase: PhaseUnstaging}, false},
		tc{"unstage", ModeDeferred, crashPoint{Kind: KindStage, Phase: PhaseForgotten}, false})

	for _, c := range cases {
		name := fmt.Sprintf("%s/%s/%s", c.op, c.mode, c.at)
		if c.giveUp {
			name += "/give-up"
		}
		t.Run(name, func(t *testing.T) {
			e.t = t
			pod := pods["ns/vm"]
			if c.mode == ModeHost {
				pod = pods["ns/web"]
			}
			staging, target := e.staging("pv-crash"), e.target(pod.UID, "pv-crash")
			stage := &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
				VolumeCapability: mountCap(), VolumeContext: vol.GetVolumeContext()}
			pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
				VolumeCapability: mountCap(), VolumeContext: podContext(vol, "ns", pod.Name, pod.UID)}
			unpub := &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}
			unstage := &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			call := func(n csi.NodeClient, op string) error {
				var err error
				switch op {
				case "stage":
					_, err = n.NodeStageVolume(ctx, stage)
				case "publish":
					_, err = n.NodePublishVolume(ctx, pub)
				case "unpublish":
					_, err = n.NodeUnpublishVolume(ctx, unpub)
				case "unstage":
					_, err = n.NodeUnstageVolume(ctx, unstage)
				}
				return err
			}
			lifecycle := []string{"stage", "publish", "unpublish", "unstage"}
			killed := slices.Index(lifecycle, c.op)

			crashing := e.startChild(c.at, pods)
			n := crashing.node()
			for _, op := range lifecycle[:killed] {
				must(op, call(n, op))
			}
			if err := call(n, c.op); err == nil {
				crashing.stop()
				t.Fatalf("the %s call succeeded: %s was never reached", c.op, c.at)
			}
			crashing.killed()

			p := e.startChild(crashPoint{}, pods)
			defer p.stop()
			n = p.node()
			// Kubelet retries the killed call and goes on to the end of the lifecycle or, giving up, undoes
			// what the killed call began (unstage for stage, unpublish for publish) and what comes after.
			rest, first := lifecycle[killed:], "retried "+c.op
			if c.giveUp {
				rest = lifecycle[slices.Index(lifecycle, "un"+c.op):]
				first = rest[0] + " after a killed " + c.op
			}
			for i, op := range rest {
				what := op
				if i == 0 {
					what = first
				}
				must(what, call(n, op))
				if op == "publish" {
					e.assertPublished(c.mode, target)
				}
			}
			e.assertClean()
			if _, err := os.Stat(target); !os.IsNotExist(err) {
				t.Errorf("target path left: %v", err)
			}
		})
	}
}

// assertPublished fails the test unless the volume at target is published in mode (see published).
func (e *env) assertPublished(mode Mode, target string) {
	e.t.Helper()
	if err := e.published(mode, target); err != nil {
		e.t.Fatal(err)
	}
}

// published checks a published volume: deferred, a descriptor in crustd on the private path's device, an
// empty target with the guard alone mounted on it (the pods have no subPath) and one private bind mount;
// host-mounted, a mounted target and no descriptor.
func (e *env) published(mode Mode, target string) error {
	v, err := e.crust.GetVolume(context.Background(), &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	priv := mountsUnder(filepath.Join(filepath.Dir(target), privateBlockDir))
	switch mode {
	case ModeDeferred:
		if err != nil {
			return fmt.Errorf("no descriptor for %s: %w", target, err)
		}
		if len(priv) != 1 {
			return fmt.Errorf("private mounts %v, want one", priv)
		}
		dev, derr := resolveDevice(priv[0])
		if derr != nil || v.GetVolume().GetResolvedBackingPath() != dev {
			return fmt.Errorf("descriptor device %s, private path's %s (%v)", v.GetVolume().GetResolvedBackingPath(), dev, derr)
		}
		if on, gerr := guarded(target); gerr != nil || !on || len(mountsUnder(target)) != 1 {
			return fmt.Errorf("deferred target: mounts %v, guarded %v (%v); want the guard alone", mountsUnder(target), on, gerr)
		}
	case ModeHost:
		if err == nil {
			return fmt.Errorf("a host-mounted volume has a descriptor: %v", v)
		}
		if m := mountsUnder(target); len(m) != 1 {
			return fmt.Errorf("host target mounts %v, want one", m)
		}
	}
	return nil
}
