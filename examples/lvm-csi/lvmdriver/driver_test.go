package lvmdriver_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
	"crust.dev/crust/internal/testutil/crustdtest"
	"crust.dev/crust/internal/testutil/sandbox"
)

// csiClients are the three services over the driver's socket.
type csiClients struct {
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
}

// startDriver runs the driver on vg with cfg's other fields, and returns its clients.
func startDriver(t *testing.T, vg *lvmtest.VG, cfg lvmdriver.Config) csiClients {
	t.Helper()
	cfg.VG, cfg.Devices = vg.Name, []string{vg.Device}
	if cfg.Log == nil {
		cfg.Log = testLogger(t)
	}
	endpoint := filepath.Join(t.TempDir(), "csi.sock")
	stop, err := lvmdriver.Start(endpoint, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return csiClients{csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)}
}

// startOnVG starts a driver (see startDriver) on a new volume group of size bytes (see lvmtest.New) and
// returns both.
func startOnVG(t *testing.T, size int64, cfg lvmdriver.Config) (csiClients, *lvmtest.VG) {
	t.Helper()
	vg := lvmtest.New(t, size)
	return startDriver(t, vg, cfg), vg
}

func testLogger(*testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// crustd runs a crustd in this process (internal/testutil/crustdtest) with its kubelet dir under a temp
// dir, and returns its socket and kubelet dir.
func crustd(t *testing.T) (socket, kubelet string) {
	t.Helper()
	cfg, err := crustdtest.Config(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DeviceAllow = []string{"/dev/loop*", "/dev/dm-*"}
	crustdtest.StartT(t, cfg, testLogger(t))
	return cfg.Socket, cfg.KubeletDir
}

func mountCap(fs, group string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs, VolumeMountGroup: group}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %s", what, err, code)
	}
}

// handler answers stats and expansion as a runtime handler would from inside its sandbox.
type fixedHandler struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer
	capacity int64
}

func (h *fixedHandler) GetVolumeStats(context.Context, *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	return &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Total: h.capacity, Used: 1 << 20, Available: h.capacity - 1<<20, Unit: crustv1.VolumeUsage_UNIT_BYTES},
	}}, nil
}

func (h *fixedHandler) ExpandVolume(_ context.Context, r *crustv1.RuntimeHandlerServiceExpandVolumeRequest) (*crustv1.RuntimeHandlerServiceExpandVolumeResponse, error) {
	h.capacity = r.GetRequiredBytes()
	return &crustv1.RuntimeHandlerServiceExpandVolumeResponse{CapacityBytes: h.capacity}, nil
}

// Flow 1 end to end: a StorageClass with crust.dev/defer: "true" makes NodeStageVolume leave the host
// alone and NodePublishVolume deposit the logical volume's descriptor with crustd; stats and expansion
// reach the runtime handler that claims it; NodeUnpublishVolume removes the descriptor.
func TestDeferral(t *testing.T) {
	vg := lvmtest.New(t, 2<<30)
	socket, kubelet := crustd(t)
	d := startDriver(t, vg, lvmdriver.Config{CrustSocket: socket, DefaultFSType: "xfs"})
	ctx := ctxT(t)

	cv, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "pvc-deferred", CapacityRange: &csi.CapacityRange{RequiredBytes: 320 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", "")},
		Parameters: map[string]string{volume.DeferKey: "true", "csi.storage.k8s.io/pvc/name": "data",
			volume.TotalIOPSKey: "50", volume.WriteBytesPerSecondKey: "1Mi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	vol := cv.GetVolume()
	if vc := vol.GetVolumeContext(); vc[volume.DeferKey] != "true" || vc[volume.TotalIOPSKey] != "50" ||
		vc[volume.WriteBytesPerSecondKey] != "1Mi" || vol.GetCapacityBytes() != 320<<20 {
		t.Fatalf("created %v", vol)
	}
	const uid = "cccccccc-0000-4000-8000-000000000001"
	podDir := filepath.Join(kubelet, "pods", uid, "volumes", "kubernetes.io~csi", "pvc-deferred")
	if err := os.MkdirAll(podDir, 0o750); err != nil {
		t.Fatal(err)
	}
	target, staging := filepath.Join(podDir, "mount"), filepath.Join(t.TempDir(), "staging")
	volCtx := map[string]string{volume.PodUIDKey: uid, volume.PodNameKey: "db-0", volume.PodNamespaceKey: "shop"}
	maps.Copy(volCtx, vol.GetVolumeContext()) // as kubelet passes the PersistentVolume's attributes
	c := mountCap("", "2000")

	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: c, VolumeContext: volCtx}); err != nil {
		t.Fatal(err)
	}
	if mounted(t, staging) {
		t.Fatal("a deferred volume was mounted on the host at stage")
	}
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: c, VolumeContext: volCtx}
	for i := 0; i < 2; i++ {
		if _, err := d.NodePublishVolume(ctx, pub); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() || mounted(t, target) {
		t.Fatalf("target: want an empty directory, not a mount (%v)", err)
	}
	crust, err := client.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = crust.Close() }()
	gv, err := crust.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if err != nil {
		t.Fatal(err)
	}
	s := gv.GetVolume().GetSpec()
	if s.GetVolumeBackingPath() != "/dev/"+vg.Name+"/"+vol.GetVolumeId() || !s.GetCreateFilesystem() || s.GetFsType() != "xfs" ||
		s.GetVolumeSupplementalGroup() != 2000 || s.GetCsiDriver() != lvmdriver.DefaultName || s.GetPodUid() != uid ||
		s.GetMetadata()[volume.PodNameKey] != "db-0" ||
		!proto.Equal(s.GetIoLimits(), &crustv1.IOLimits{TotalIops: 50, WriteBytesPerSecond: 1 << 20}) {
		t.Errorf("deposited %v", s)
	}
	if blank(t, "/dev/"+vg.Name+"/"+vol.GetVolumeId()) != true {
		t.Error("the host formatted a deferred volume")
	}

	// Before a sandbox claims it: stats give the logical volume's size with usage unknown, and an
	// expansion grows the device the host sees and is recorded for the sandbox's mount.
	sreq := &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: target}
	if st, err := d.NodeGetVolumeStats(ctx, sreq); err != nil || len(st.GetUsage()) != 1 ||
		st.GetUsage()[0].GetTotal() != 320<<20 || st.GetUsage()[0].GetUsed() != 0 {
		t.Fatalf("stats before a sandbox claims: %v, %v; want the volume's 320 MiB, usage unknown", st, err)
	}
	if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 352 << 20}}); err != nil {
		t.Fatal(err)
	}
	if ex, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.GetVolumeId(), VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 352 << 20}}); err != nil || ex.GetCapacityBytes() != 352<<20 {
		t.Fatalf("expand before a sandbox claims: %v, %v; want the device's 352 MiB", ex, err)
	}
	if gv, err := crust.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target}); err != nil ||
		gv.GetVolume().GetRequestedBytes() != 352<<20 {
		t.Fatalf("requested_bytes after expand before a claim: %v, %v", gv, err)
	}
	// An unknown volume, or one not at the path named, is NotFound, with deferral on as off.
	for _, id := range []string{lvmdriver.VolumeID("none"), vol.GetVolumeId()} {
		_, err = d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: "some/path"})
		wantCode(t, "stats of a volume not at the path", err, codes.NotFound)
		_, err = d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: "some/path",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
		wantCode(t, "expand of a volume not at the path", err, codes.NotFound)
	}

	h := &fixedHandler{capacity: 300 << 20}
	rt, endpoint, _ := sandbox.Serve(t, socket, filepath.Join(t.TempDir(), "h.sock"), h)
	if _, err := rt.Claim(ctx, target, "sandbox-1", endpoint); err != nil {
		t.Fatal(err)
	}
	st, err := d.NodeGetVolumeStats(ctx, sreq)
	if err != nil || st.GetUsage()[0].GetTotal() != 300<<20 {
		t.Fatalf("stats: %v, %v", st, err)
	}
	if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 400 << 20}}); err != nil {
		t.Fatal(err)
	}
	ex, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.GetVolumeId(), VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 400 << 20}})
	if err != nil || ex.GetCapacityBytes() != 400<<20 || h.capacity != 400<<20 {
		t.Fatalf("expand: %v, %v (handler at %d)", ex, err, h.capacity)
	}
	if err := rt.Release(ctx, target, "sandbox-1"); err != nil {
		t.Fatal(err)
	}

	unpub := &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}
	for i := 0; i < 2; i++ {
		if _, err := d.NodeUnpublishVolume(ctx, unpub); err != nil {
			t.Fatalf("unpublish %d: %v", i, err)
		}
	}
	if held, err := crust.Holds(ctx, target); err != nil || held {
		t.Errorf("crustd still holds the target: %v, %v", held, err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target left behind: %v", err)
	}
	if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}

	// A block volume is never deferred, and neither is anything when the driver has no crust socket.
	cb, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-block",
		VolumeCapabilities: []*csi.VolumeCapability{blockCap()}, Parameters: map[string]string{volume.DeferKey: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	btarget := filepath.Join(podDir+"-block", "dev")
	_ = os.MkdirAll(filepath.Dir(btarget), 0o750)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: cb.GetVolume().GetVolumeId(), TargetPath: btarget,
		VolumeCapability: blockCap(), VolumeContext: volCtx}); err != nil {
		t.Fatal(err)
	}
	if held, _ := crust.Holds(ctx, btarget); held || !mounted(t, btarget) {
		t.Errorf("block volume: held %v, bind-mounted %v; want a host bind mount", held, mounted(t, btarget))
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: cb.GetVolume().GetVolumeId(), TargetPath: btarget}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: cb.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

// Without deferral a mount volume is formatted, mounted, given the fsGroup, measured and grown online on
// the host; a publish with other parameters is AlreadyExists; and a volume in use cannot be deleted.
func TestHostMount(t *testing.T) {
	d, _ := startOnVG(t, 2<<30, lvmdriver.Config{})
	ctx := ctxT(t)
	cv, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-host", CapacityRange: &csi.CapacityRange{RequiredBytes: 320 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("xfs", "")}, Parameters: map[string]string{volume.DeferKey: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	id := cv.GetVolume().GetVolumeId()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pod", "mount")
	_ = os.MkdirAll(filepath.Dir(target), 0o750)
	c := mountCap("xfs", "2000")
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c,
		VolumeContext: cv.GetVolume().GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	pub := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c,
		VolumeContext: cv.GetVolume().GetVolumeContext()}
	for i := 0; i < 2; i++ {
		if _, err := d.NodePublishVolume(ctx, pub); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil || st.Gid != 2000 || st.Mode&unix.S_ISGID == 0 {
		t.Errorf("fsGroup not applied: gid %d mode %o (%v)", st.Gid, st.Mode, err)
	}
	ro := proto.Clone(pub).(*csi.NodePublishVolumeRequest)
	ro.Readonly = true
	_, err = d.NodePublishVolume(ctx, ro)
	wantCode(t, "publish read-only over a read-write publish", err, codes.AlreadyExists)
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "delete while mounted", err, codes.FailedPrecondition)

	if err := os.WriteFile(filepath.Join(target, "f"), []byte("crust"), 0o644); err != nil {
		t.Fatal(err)
	}
	total := func() int64 {
		t.Helper()
		r, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
		if err != nil || len(r.GetUsage()) != 2 || r.GetUsage()[1].GetUnit() != csi.VolumeUsage_INODES || r.GetUsage()[1].GetUsed() == 0 {
			t.Fatalf("stats: %v, %v", r, err)
		}
		return r.GetUsage()[0].GetTotal()
	}
	before := total()
	_, err = d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: staging + "x"})
	wantCode(t, "stats where the volume is not", err, codes.NotFound)
	_, err = d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 640 << 20}})
	wantCode(t, "node expand past the device", err, codes.OutOfRange)
	ce, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 640 << 20}, VolumeCapability: c})
	if err != nil || ce.GetCapacityBytes() != 640<<20 || !ce.GetNodeExpansionRequired() {
		t.Fatalf("controller expand: %v, %v", ce, err)
	}
	if _, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 640 << 20}}); err != nil {
		t.Fatal(err)
	}
	if after := total(); after < before+250<<20 {
		t.Errorf("filesystem grew from %d to %d bytes only", before, after)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if mounted(t, staging) {
		t.Error("still mounted at the staging path")
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

// Capacity ranges are honoured in whole extents, names are idempotent, and each refusal has its code.
func TestControllerRules(t *testing.T) {
	d, vg := startOnVG(t, 1<<30, lvmdriver.Config{})
	ctx := ctxT(t)
	caps := []*csi.VolumeCapability{mountCap("", "")}
	create := func(name string, req, lim int64) (*csi.Volume, error) {
		r, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: caps,
			CapacityRange: &csi.CapacityRange{RequiredBytes: req, LimitBytes: lim}})
		return r.GetVolume(), err
	}
	v, err := create("a", 5<<20, 0)
	if err != nil || v.GetCapacityBytes() != 8<<20 || v.GetVolumeId() != lvmdriver.VolumeID("a") {
		t.Fatalf("5 MiB asked: %v, %v; want 8 MiB (two extents)", v, err)
	}
	if v2, err := create("a", 8<<20, 8<<20); err != nil || v2.GetVolumeId() != v.GetVolumeId() {
		t.Errorf("same name, fitting range: %v, %v", v2, err)
	}
	_, err = create("a", 16<<20, 0)
	wantCode(t, "same name, larger", err, codes.AlreadyExists)
	_, err = create("b", 5<<20, 6<<20)
	wantCode(t, "no whole extent in range", err, codes.OutOfRange)
	_, err = create("b", 8<<20, 4<<20)
	wantCode(t, "limit below required", err, codes.InvalidArgument)
	_, err = create("b", -1, 0)
	wantCode(t, "negative", err, codes.InvalidArgument)
	_, err = create("b", 4<<30, 0)
	wantCode(t, "larger than the volume group", err, codes.ResourceExhausted)
	if v, err := create("c", 0, 0); err != nil || v.GetCapacityBytes() != 128<<20 {
		t.Errorf("no range: %v, %v; want the 128 MiB default", v, err)
	}
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "d", VolumeCapabilities: caps, Parameters: map[string]string{"speed": "fast"}})
	wantCode(t, "unknown parameter", err, codes.InvalidArgument)
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "d", VolumeCapabilities: caps, Parameters: map[string]string{volume.ReadIOPSKey: "-5"}})
	if wantCode(t, "negative I/O limit", err, codes.InvalidArgument); !strings.Contains(status.Convert(err).Message(), volume.ReadIOPSKey) {
		t.Errorf("the refusal does not name the parameter: %v", err)
	}
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "d", VolumeCapabilities: caps, Parameters: map[string]string{volume.EncryptionParamKey: "aes"}})
	if wantCode(t, "unknown encryption", err, codes.InvalidArgument); !strings.Contains(status.Convert(err).Message(), volume.EncryptionParamKey) {
		t.Errorf("the refusal does not name the parameter: %v", err)
	}
	if v, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "e", VolumeCapabilities: caps, Parameters: map[string]string{
		volume.DeferKey: "true", volume.EncryptionParamKey: "luks2", volume.EncryptionIntegrityKey: "true"}}); err != nil ||
		v.GetVolume().GetVolumeContext()[volume.EncryptionParamKey] != "luks2" || v.GetVolume().GetVolumeContext()[volume.EncryptionIntegrityKey] != "true" {
		t.Errorf("an encrypting class: %v, %v; want its keys in the volume context", v, err)
	} else if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
		t.Error(err)
	}
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "d", VolumeCapabilities: []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}}}})
	wantCode(t, "multi-node access", err, codes.InvalidArgument)
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "d", VolumeCapabilities: []*csi.VolumeCapability{mountCap("vfat", "")}})
	wantCode(t, "vfat", err, codes.InvalidArgument)

	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: lvmdriver.VolumeID("none"),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
	wantCode(t, "expand unknown", err, codes.NotFound)
	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20, LimitBytes: 4 << 20}})
	wantCode(t, "expand to below the size", err, codes.OutOfRange)
	vv, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId(),
		VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	if err != nil || vv.GetConfirmed() == nil {
		t.Errorf("validate block: %v, %v", vv, err)
	}
	_, err = d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "x", VolumeCapabilities: caps})
	wantCode(t, "validate unknown", err, codes.NotFound)
	for _, id := range []string{v.GetVolumeId(), v.GetVolumeId(), "not-an-id", lvmdriver.VolumeID("c")} {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if left, err := vg.LVs(); err != nil || len(left) != 0 {
		t.Errorf("left: %v, %v", left, err)
	}
	if p, err := d.Probe(ctx, &csi.ProbeRequest{}); err != nil || !p.GetReady().GetValue() {
		t.Errorf("probe: %v, %v", p, err)
	}
}

// A restarted driver gives the volumes it made their devices again, with their data.
func TestRestart(t *testing.T) {
	vg := lvmtest.New(t, 1<<30)
	ctx := ctxT(t)
	cfg := lvmdriver.Config{VG: vg.Name, Devices: []string{vg.Device}, Log: testLogger(t)}
	d, err := lvmdriver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cv, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "keep", VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
	if err != nil {
		t.Fatal(err)
	}
	dev := "/dev/" + vg.Name + "/" + cv.GetVolume().GetVolumeId()
	if err := os.WriteFile(dev, []byte("crust was here"), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	c := startDriver(t, vg, lvmdriver.Config{})
	b := make([]byte, 14)
	f, err := os.Open(dev)
	if err == nil {
		_, err = io.ReadFull(f, b)
		_ = f.Close()
	}
	if err != nil || string(b) != "crust was here" {
		t.Fatalf("after restart: %q, %v", b, err)
	}
	if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: cv.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	m, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	return len(m) > 0
}

// blank reports whether the device's first MiB is all zeros.
func blank(t *testing.T, dev string) bool {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, 1<<20)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
