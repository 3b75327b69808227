package csiproxy

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"k8s.io/client-go/kubernetes/fake"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/testutil"
)

// With --controller, a class's I/O limits and encryption keys never reach the driver's parameters and
// come back in the volume context as given; a value crustd or the descriptor would refuse, or encryption
// of a raw block volume, is INVALID_ARGUMENT naming the parameter, and the driver is not asked.
func TestControllerParameters(t *testing.T) {
	cc, d := startController(t)
	ctrl := csi.NewControllerClient(cc)
	ctx := context.Background()
	create := func(params map[string]string, c *csi.VolumeCapability) (*csi.CreateVolumeResponse, error) {
		return ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc", Parameters: params, VolumeCapabilities: []*csi.VolumeCapability{c}})
	}
	seen := func() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.seen) }
	limits := map[string]string{volume.TotalIOPSKey: "50", volume.WriteBytesPerSecondKey: "1Mi"}
	for _, tc := range []struct {
		name      string
		params    map[string]string
		c         *csi.VolumeCapability
		wantDefer bool
	}{
		{"deferring class", map[string]string{DeferKey: "true", "type": "ssd"}, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), true},
		{"limits alone", map[string]string{"type": "ssd"}, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), false},
		{"raw block", map[string]string{DeferKey: "true", "type": "ssd"}, blockCap(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := maps.Clone(tc.params)
			maps.Copy(params, limits)
			resp, err := create(params, tc.c)
			if err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			got := d.seen[len(d.seen)-1].(*csi.CreateVolumeRequest).GetParameters()
			d.mu.Unlock()
			if len(got) != 1 || got["type"] != "ssd" {
				t.Errorf("the driver saw parameters %v, want only type", got)
			}
			want := maps.Clone(limits)
			if tc.wantDefer {
				want[DeferKey] = "true"
			}
			vc := maps.Clone(resp.GetVolume().GetVolumeContext())
			if vc[DeferKey] == "" {
				delete(vc, DeferKey) // the stub echoes the parameter it saw, none
			}
			if !maps.Equal(vc, want) {
				t.Errorf("volume context %v, want %v", vc, want)
			}
		})
	}
	for _, tc := range []struct{ name, key, value, reason string }{
		{"not a quantity", volume.ReadBytesPerSecondKey, "lots", "is not a quantity"},
		{"negative", volume.WriteIOPSKey, "-3", "is negative"},
		{"too large", volume.TotalBytesPerSecondKey, "2P", "is larger than"},
		{"total and read", volume.ReadIOPSKey, "10", "cannot be set together with " + volume.TotalIOPSKey},
		{"unknown encryption", volume.EncryptionParamKey, "aes-xts", "is not an encryption crust knows"},
		{"integrity not a boolean", volume.EncryptionIntegrityKey, "maybe", "is not a boolean"},
		{"integrity without encryption", volume.EncryptionIntegrityKey, "true", "integrity needs " + volume.EncryptionParamKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := map[string]string{DeferKey: "true", volume.TotalIOPSKey: "50", tc.key: tc.value}
			refused(t, seen, tc.key, tc.reason, func() error {
				_, err := create(params, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER))
				return err
			})
		})
	}
	// An encrypting class: its keys reach the volume context, not the driver; a raw block volume of it is
	// refused.
	enc := map[string]string{DeferKey: "true", volume.EncryptionParamKey: "luks2", volume.EncryptionIntegrityKey: "true", "type": "ssd"}
	resp, err := create(enc, mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER))
	if vc := resp.GetVolume().GetVolumeContext(); err != nil || vc[volume.EncryptionParamKey] != "luks2" || vc[volume.EncryptionIntegrityKey] != "true" {
		t.Errorf("an encrypting class: %v, %v; want its keys in the volume context", resp, err)
	}
	refused(t, seen, volume.EncryptionParamKey, "raw block", func() error { _, err := create(enc, blockCap()); return err })
}

// refused runs call and checks that it is INVALID_ARGUMENT naming key first, with reason, and that the
// driver was not asked.
func refused(t *testing.T, seen func() int, key, reason string, call func() error) {
	t.Helper()
	before := seen()
	err := call()
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), key+": ") ||
		!strings.Contains(s.Message(), reason) {
		t.Errorf("got %v, want INVALID_ARGUMENT naming %s: ...%s", err, key, reason)
	}
	if n := seen(); n != before {
		t.Errorf("the driver was asked %d times for a refused request", n-before)
	}
}

// On the node, a deferred publish carries the volume context's I/O limits into the descriptor; limits
// crustd would refuse are INVALID_ARGUMENT naming the parameter at stage and at publish, and nothing is
// staged, published, recorded or deposited.
func TestNodeIOLimits(t *testing.T) {
	e := newEnv(t)
	cc := startProxy(t, e.config(), e.log)
	node := csi.NewNodeClient(cc)
	ctx := context.Background()
	vol := e.createVolumeWith("pvc-limits", 64<<20, map[string]string{DeferKey: "true", volume.ReadIOPSKey: "100", volume.TotalBytesPerSecondKey: "10Mi"})
	const uid = "0e0e0e0e-0000-4000-8000-0000000000a1"
	staging, target := e.staging("pv-limits"), e.target(uid, "pv-limits")

	bad := podContext(vol, "ns", "vm", uid)
	bad[volume.WriteIOPSKey] = "1.5"
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: bad}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), volume.WriteIOPSKey) {
		t.Fatalf("stage with a bad limit: %v, want INVALID_ARGUMENT naming %s", err, volume.WriteIOPSKey)
	}
	bad[volume.WriteIOPSKey], bad[volume.WriteBytesPerSecondKey] = "0", "1Mi" // beside the total: crustd's rule
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: xfsCap(""), VolumeContext: bad}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), volume.WriteBytesPerSecondKey+": cannot be set together with "+volume.TotalBytesPerSecondKey) {
		t.Fatalf("publish with exclusive limits: %v, want INVALID_ARGUMENT naming %s", err, volume.WriteBytesPerSecondKey)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("a refused publish made the target: %v", err)
	}
	e.assertClean()

	good := podContext(vol, "ns", "vm", uid)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: good}); err != nil {
		t.Fatal(err)
	}
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: xfsCap(""), VolumeContext: good}
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	got, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if want := (&crustv1.IOLimits{ReadIops: 100, TotalBytesPerSecond: 10 << 20}); err != nil || !proto.Equal(got.GetVolume().GetSpec().GetIoLimits(), want) {
		t.Fatalf("descriptor %v, %v; want io_limits %v", got, err, want)
	}
	// One builder: the driver's own call to api/client with the same request deposits the same descriptor,
	// so crustd takes it as a repeat (another descriptor would be ALREADY_EXISTS) and keeps what it holds.
	direct, err := client.New(e.crustSock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = direct.Close() }()
	if _, err := direct.Publish(ctx, pub, got.GetVolume().GetSpec().GetVolumeBackingPath(), client.CreateFilesystem(),
		client.DriverName(e.driverName)); err != nil {
		t.Fatalf("the same publish through api/client: %v", err)
	}
	again, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if err != nil || !proto.Equal(again.GetVolume().GetSpec(), got.GetVolume().GetSpec()) {
		t.Fatalf("after the direct publish: %v, %v; want %v", again, err, got)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}

// On the node, a deferred publish of an encrypting class carries the key of the publish's secret into the
// descriptor, which crustd answers redacted, and whole to the handler that claims it; the key is nowhere
// in the proxy's log (at debug level) or its journal. A publish whose secret lacks the key is
// INVALID_ARGUMENT naming the secret's entry, and nothing is published or deposited. A key given at
// stage instead serves the publishes of that stage, and goes with the unstage.
func TestNodeEncryption(t *testing.T) {
	e := newEnv(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	node := csi.NewNodeClient(startProxy(t, e.config(), log))
	ctx := context.Background()
	vol := e.createVolumeWith("pvc-enc", 64<<20, map[string]string{DeferKey: "true", volume.EncryptionParamKey: "luks2"})
	const uid = "0e0e0e0e-0000-4000-8000-0000000000a2"
	staging, target := e.staging("pv-enc"), e.target(uid, "pv-enc")
	volCtx := podContext(vol, "ns", "vm", uid)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: volCtx}); err != nil {
		t.Fatal(err)
	}
	key := testutil.RandomHex(t, 24)
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: xfsCap(""), VolumeContext: volCtx, Secrets: map[string]string{"other": "x"}}
	if _, err := node.NodePublishVolume(ctx, pub); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "secrets."+volume.EncryptionSecretKey) {
		t.Fatalf("publish without the key: %v; want INVALID_ARGUMENT naming secrets.%s", err, volume.EncryptionSecretKey)
	}
	if l, err := e.crust.ListVolumes(ctx, &crustv1.ListVolumesRequest{}); err != nil || len(l.GetVolumes()) != 0 {
		t.Fatalf("after a refused publish crustd holds %v, %v", l.GetVolumes(), err)
	}
	pub.Secrets[volume.EncryptionSecretKey] = key
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	got, err := e.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if md := got.GetVolume().GetSpec().GetMetadata(); err != nil || md[volume.EncryptionKey] != volume.Redacted {
		t.Fatalf("descriptor %v, %v; want the encryption key in its metadata, answered redacted", got, err)
	}
	records := 0
	_ = filepath.WalkDir(e.state, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		records++
		if b, err := os.ReadFile(path); err != nil || bytes.Contains(b, []byte(key)) {
			t.Errorf("%s holds the key (%v)", path, err)
		}
		return nil
	})
	if records == 0 {
		t.Error("the proxy's journal holds no record of the publish")
	}
	if claimedKey(t, e, target) != key {
		t.Error("the handler that claims the volume is not given the publish's key")
	}
	unpublishUnstage(t, node, vol.GetVolumeId(), staging, target)

	// The key given at stage (a node-stage secret) serves the publishes that follow, whose secrets lack it;
	// after the unstage it is gone, and a publish without a key is refused again.
	stageKey := testutil.RandomHex(t, 24)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: volCtx, Secrets: map[string]string{volume.EncryptionSecretKey: stageKey}}); err != nil {
		t.Fatal(err)
	}
	pub.Secrets = nil
	if _, err := node.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if claimedKey(t, e, target) != stageKey {
		t.Error("the handler that claims the volume is not given the stage's key")
	}
	unpublishUnstage(t, node, vol.GetVolumeId(), staging, target)
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: volCtx}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, pub); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish without a key after a stage without one: %v; want INVALID_ARGUMENT", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), target) || strings.Contains(logs.String(), key) || strings.Contains(logs.String(), stageKey) {
		t.Errorf("the proxy's log names the target %v, holds a key %v", strings.Contains(logs.String(), target),
			strings.Contains(logs.String(), key) || strings.Contains(logs.String(), stageKey))
	}
}

// TestStageKeySurvivesRestart: the key given at stage is kept on tmpfs, so that a proxy restarted between
// the stage and the publish gives it to the descriptor all the same; its record names the staging path
// and lies nowhere but the key directory; after the unstage it is gone from there, and a proxy started
// then has no key for the path.
func TestStageKeySurvivesRestart(t *testing.T) {
	e := newEnv(t)
	run := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "crust-test", run).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(run, unix.MNT_DETACH) })
	cfg := e.config()
	cfg.StageKeyDir = filepath.Join(run, "keys")
	_, cc, stop := runStoppableProxy(t, cfg, e.log, Deps{})
	ctx := context.Background()
	vol := e.createVolumeWith("pvc-key", 64<<20, map[string]string{DeferKey: "true", volume.EncryptionParamKey: "luks2"})
	const uid = "0e0e0e0e-0000-4000-8000-0000000000a3"
	staging, target := e.staging("pv-key"), e.target(uid, "pv-key")
	volCtx := podContext(vol, "ns", "vm", uid)
	key := testutil.RandomHex(t, 24)
	if _, err := csi.NewNodeClient(cc).NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: volCtx, Secrets: map[string]string{volume.EncryptionSecretKey: key}}); err != nil {
		t.Fatal(err)
	}
	holding := func() []string {
		var found []string
		for _, root := range []string{run, e.root} {
			_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
				if b, rerr := os.ReadFile(path); err == nil && !d.IsDir() && rerr == nil && bytes.Contains(b, []byte(key)) {
					found = append(found, path)
				}
				return nil
			})
		}
		return found
	}
	if h := holding(); len(h) != 1 || !strings.HasPrefix(h[0], cfg.StageKeyDir+"/") {
		t.Fatalf("files holding the key after the stage: %v; want its record in %s alone", h, cfg.StageKeyDir)
	}
	stop()

	_, cc, stop = runStoppableProxy(t, cfg, e.log, Deps{})
	node := csi.NewNodeClient(cc)
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: xfsCap(""), VolumeContext: volCtx}); err != nil {
		t.Fatalf("publish after a restart of the proxy: %v", err)
	}
	if claimedKey(t, e, target) != key {
		t.Error("after a restart of the proxy, the handler is not given the stage's key")
	}
	unpublishUnstage(t, node, vol.GetVolumeId(), staging, target)
	if h := holding(); len(h) != 0 {
		t.Fatalf("files holding the key after the unstage: %v", h)
	}
	stop()
	e.assertClean()
}

// claimedKey claims the volume at target for a sandbox, as a runtime handler does, and returns the
// encryption key crustd answers the claim with, then releases it.
func claimedKey(t *testing.T, e *env, target string) string {
	t.Helper()
	conn, err := crustd.Dial(e.crustSock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	rt := crustv1.NewRuntimeServiceClient(conn)
	ctx := context.Background()
	claim, err := rt.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: target, SandboxId: "sb-key"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, SandboxId: "sb-key"}); err != nil {
		t.Fatal(err)
	}
	return claim.GetVolume().GetSpec().GetMetadata()[volume.EncryptionKey]
}

// unpublishUnstage unpublishes target and unstages staging, through the proxy.
func unpublishUnstage(t *testing.T, node csi.NodeClient, volumeID, staging, target string) {
	t.Helper()
	ctx := context.Background()
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volumeID, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volumeID, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// A deferring class's filesystem that several nodes could write (ReadWriteMany: MULTI_NODE_MULTI_WRITER,
// or MULTI_NODE_SINGLE_WRITER) is INVALID_ARGUMENT naming the access mode, at CreateVolume before the
// driver is asked, and at NodeStageVolume and NodePublishVolume (a static PV never passes CreateVolume),
// where nothing is staged, published, recorded or deposited. ReadOnlyMany is deferred; a class that does
// not defer reaches the driver with any mode.
func TestMultiNodeWritersRefused(t *testing.T) {
	cc, d := startController(t)
	ctrl := csi.NewControllerClient(cc)
	ctx := context.Background()
	seen := func() int { d.mu.Lock(); defer d.mu.Unlock(); return len(d.seen) }
	create := func(params map[string]string, caps ...*csi.VolumeCapability) (*csi.CreateVolumeResponse, error) {
		return ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc", Parameters: params, VolumeCapabilities: caps})
	}
	deferring := map[string]string{DeferKey: "true"}
	rwo := mountCapMode("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	for _, m := range []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER} {
		refused(t, seen, "volume_capabilities[1].access_mode.mode", m.String()+" lets pods on several nodes write",
			func() error { _, err := create(deferring, rwo, mountCapMode("ext4", m)); return err })
		if _, err := create(map[string]string{"type": "nfs"}, mountCapMode("", m)); err != nil {
			t.Errorf("%s of a class that does not defer: %v", m, err)
		}
	}
	rox, err := create(deferring, mountCapMode("ext4", csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY))
	if err != nil || rox.GetVolume().GetVolumeContext()[DeferKey] != "true" {
		t.Errorf("ReadOnlyMany of a deferring class: %v, %v; want it deferred", rox, err)
	}

	e := newEnv(t)
	node := csi.NewNodeClient(startProxy(t, e.config(), e.log))
	vol := e.createVolumeWith("pvc-rwx", 64<<20, deferring)
	const uid = "0e0e0e0e-0000-4000-8000-0000000000a2"
	staging, target := e.staging("pv-rwx"), e.target(uid, "pv-rwx")
	rwx := xfsCap("")
	rwx.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	const field = "volume_capability.access_mode.mode: MULTI_NODE_MULTI_WRITER lets pods on several nodes write"
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: rwx, VolumeContext: podContext(vol, "ns", "vm", uid)}); status.Code(err) != codes.InvalidArgument ||
		!strings.HasPrefix(status.Convert(err).Message(), field) {
		t.Fatalf("stage of a deferring ReadWriteMany volume: %v, want INVALID_ARGUMENT: %s", err, field)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: rwx, VolumeContext: podContext(vol, "ns", "vm", uid)}); status.Code(err) != codes.InvalidArgument ||
		!strings.HasPrefix(status.Convert(err).Message(), field) {
		t.Fatalf("publish of a deferring ReadWriteMany volume: %v, want INVALID_ARGUMENT: %s", err, field)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("a refused publish made the target: %v", err)
	}
	e.assertClean()
}

// With pod look-ups (--kubeconfig), a publish of a deferring volume whose context names no pod (a
// CSIDriver without podInfoOnMount) is FAILED_PRECONDITION saying to set podInfoOnMount, and nothing is
// published, recorded or deposited: without the pod, a runc pod's volume would be deferred and its data
// would land on the node.
func TestPublishWithoutPodInfoRefused(t *testing.T) {
	e := newEnv(t)
	node := nodeProxy(t, e, fake.NewClientset())
	ctx := context.Background()
	vol := e.createVolume("pvc-nopod", 64<<20, true)
	staging, target := e.staging("pv-nopod"), e.target("0e0e0e0e-0000-4000-8000-0000000000a3", "pv-nopod")
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: xfsCap(""), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: xfsCap(""), VolumeContext: vol.GetVolumeContext()})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "podInfoOnMount: true") {
		t.Fatalf("publish without pod info: %v; want FAILED_PRECONDITION saying to set podInfoOnMount", err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("a refused publish made the target: %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	e.assertClean()
}
