package csiproxy

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	gprotocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
)

// recordingCodec is the proto codec that also keeps the bytes of every message it decodes: what the
// driver received on the wire.
type recordingCodec struct {
	encoding.CodecV2
	mu   sync.Mutex
	seen [][]byte
}

func (c *recordingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.mu.Lock()
	c.seen = append(c.seen, data.Materialize())
	c.mu.Unlock()
	return c.CodecV2.Unmarshal(data, v)
}

func (c *recordingCodec) last() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[len(c.seen)-1]
}

// unusualBytes encodes m as proto.Marshal never would: its fields in descending order of number, then
// an unknown field. The bytes decode to m (plus the unknown field), so a proxy that decodes and encodes
// again sends other bytes.
func unusualBytes(t *testing.T, m proto.Message) []byte {
	t.Helper()
	var out []byte
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := fields.Len() - 1; i >= 0; i-- {
		f := fields.Get(i)
		if !r.Has(f) {
			continue
		}
		one := r.New()
		one.Set(f, r.Get(f))
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(one.Interface())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	out = protowire.AppendTag(out, 4242, protowire.VarintType)
	out = protowire.AppendVarint(out, 7)
	if again, _ := proto.Marshal(decodeAs(t, m, out)); bytes.Equal(again, out) {
		t.Fatal("the unusual encoding is what proto.Marshal makes: the test would prove nothing")
	}
	return out
}

func decodeAs(t *testing.T, like proto.Message, b []byte) proto.Message {
	t.Helper()
	m := like.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRawBlockOfMicroVMPodPassesThrough: a raw block volume (block capability) whose class asks for
// deferral, used by a microVM pod, is never deferred: NodeStageVolume and NodePublishVolume reach the
// driver as the exact bytes kubelet sent, the proxy keeps no record and never calls crustd (there is
// none), and the publish is logged and counted as a pass-through of a block volume, with the reason.
func TestRawBlockOfMicroVMPodPassesThrough(t *testing.T) {
	dir := t.TempDir()
	d := &stubDriver{}
	rec := &recordingCodec{CodecV2: encoding.GetCodecV2(gprotocodec.Name)}
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	pods := fakePods{pods: map[string]Pod{"ns/vm": {Namespace: "ns", Name: "vm", UID: "u-vm", RuntimeClassName: "kata"}}}
	p, cc := runProxy(t, Config{CSIAddress: filepath.Join(dir, "csi.sock"),
		DriverAddress: serveStub(t, dir, d, grpc.ForceServerCodecV2(rec)),
		CrustSocket:   filepath.Join(dir, "no-crustd.sock"), StateDir: filepath.Join(dir, "state"),
		MicroVMHandlers: []string{"kata"}}, log, Deps{Pods: pods})
	ctx := context.Background()
	volCtx := map[string]string{DeferKey: "true", podNamespaceKey: "ns", podNameKey: "vm", podUIDKey: "u-vm", "z": "1", "a": "2"}
	if d, why, err := Decide(ctx, DecideInput{Capability: blockCap(), VolumeContext: volCtx,
		Deferral: deferral(pods, client.Handlers{"kata"}, "", 0)}); d != client.PassThrough || why != client.ReasonRawBlock || err != nil {
		t.Fatalf("Decide = %v, %q, %v", d, why, err)
	}

	stage := &csi.NodeStageVolumeRequest{VolumeId: "v1", StagingTargetPath: filepath.Join(dir, "staging"),
		VolumeCapability: blockCap(), VolumeContext: volCtx, Secrets: map[string]string{"k": "s"}}
	publish := &csi.NodePublishVolumeRequest{VolumeId: "v1", StagingTargetPath: stage.StagingTargetPath,
		TargetPath: filepath.Join(dir, "pods", "u-vm", "dev"), VolumeCapability: blockCap(), VolumeContext: volCtx}
	for _, c := range []struct {
		method string
		req    proto.Message
		resp   any
	}{
		{csi.Node_NodeStageVolume_FullMethodName, stage, &csi.NodeStageVolumeResponse{}},
		{csi.Node_NodePublishVolume_FullMethodName, publish, &csi.NodePublishVolumeResponse{}},
	} {
		sent := unusualBytes(t, c.req)
		if err := cc.Invoke(ctx, c.method, &frame{data: sent}, c.resp, grpc.ForceCodecV2(newRawCodec())); err != nil {
			t.Fatalf("%s: %v", c.method, err)
		}
		if got := rec.last(); !bytes.Equal(got, sent) {
			t.Fatalf("%s: the driver received\n%x\nkubelet sent\n%x", c.method, got, sent)
		}
	}
	if recs := p.journal.List(); len(recs) != 0 {
		t.Fatalf("the proxy keeps records of a passed-through volume: %v", recs)
	}
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	if !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
		return strings.Contains(l, "publish decision") && strings.Contains(l, "decision=pass-through") &&
			strings.Contains(l, "volume_mode=block") && strings.Contains(l, "raw block volume (volumeMode: Block): never deferred")
	}) {
		t.Fatalf("no pass-through decision with its reason in the log:\n%s", out)
	}
	if n := counterValue(t, p.metrics.Registry, "crust_csi_proxy_publish_decisions_total",
		map[string]string{"decision": "pass-through", "volume_mode": "block"}); n != 1 {
		t.Fatalf("crust_csi_proxy_publish_decisions_total{pass-through,block} = %v, want 1", n)
	}
}

// counterValue is the value of the counter name with exactly labels in g's gathering (0 when absent).
func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if maps.Equal(got, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
