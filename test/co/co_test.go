package co_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/testutil"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"crust.dev/crust/test/co"
)

// fakeDriver is a CSI driver that records what it gets and does nothing on the host but make and
// remove the target directory (the driver's part).
type fakeDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	name     string
	attach   bool // PUBLISH_UNPUBLISH_VOLUME
	mountGrp bool // VOLUME_MOUNT_GROUP
	nodeGrow bool // ControllerExpandVolume asks for node expansion
	notReady int  // Probe answers not ready this many times
	unavail  int  // NodePublishVolume fails with UNAVAILABLE this many times
	mu       sync.Mutex
	requests []any
	capacity int64
}

func (f *fakeDriver) rec(r any) {
	f.mu.Lock()
	f.requests = append(f.requests, r)
	f.mu.Unlock()
}

func (f *fakeDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: f.name, VendorVersion: "1"}, nil
}

func (f *fakeDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.notReady > 0 {
		f.notReady--
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

func (f *fakeDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}}}}, nil
}

func (f *fakeDriver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME}
	if f.attach {
		types = append(types, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME)
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: each(types, func(t csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
		return &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}}
	})}, nil
}

func (f *fakeDriver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	types := []csi.NodeServiceCapability_RPC_Type{csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS, csi.NodeServiceCapability_RPC_EXPAND_VOLUME}
	if f.mountGrp {
		types = append(types, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: each(types, func(t csi.NodeServiceCapability_RPC_Type) *csi.NodeServiceCapability {
		return &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}}
	})}, nil
}

// each returns f of every element of in, in order.
func each[T, U any](in []T, f func(T) U) []U {
	out := make([]U, 0, len(in))
	for _, x := range in {
		out = append(out, f(x))
	}
	return out
}

func (f *fakeDriver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "fake-node-id"}, nil
}

func (f *fakeDriver) CreateVolume(_ context.Context, r *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	f.rec(r)
	f.capacity = r.GetCapacityRange().GetRequiredBytes()
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-" + r.GetName(), CapacityBytes: f.capacity,
		VolumeContext: map[string]string{"from": "driver", volume.DeferKey: "true"}}}, nil
}

func (f *fakeDriver) DeleteVolume(_ context.Context, r *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	f.rec(r)
	return &csi.DeleteVolumeResponse{}, nil
}

func (f *fakeDriver) ControllerPublishVolume(_ context.Context, r *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	f.rec(r)
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"lun": "7"}}, nil
}

func (f *fakeDriver) ControllerUnpublishVolume(_ context.Context, r *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	f.rec(r)
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (f *fakeDriver) ControllerExpandVolume(_ context.Context, r *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	f.rec(r)
	f.capacity = r.GetCapacityRange().GetRequiredBytes()
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: f.capacity, NodeExpansionRequired: f.nodeGrow}, nil
}

func (f *fakeDriver) NodeStageVolume(_ context.Context, r *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	f.rec(r)
	if fi, err := os.Stat(r.GetStagingTargetPath()); err != nil || !fi.IsDir() {
		return nil, status.Errorf(codes.FailedPrecondition, "staging path is not a directory: %v", err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (f *fakeDriver) NodeUnstageVolume(_ context.Context, r *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	f.rec(r)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (f *fakeDriver) NodePublishVolume(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	f.mu.Lock()
	fail := f.unavail > 0
	if fail {
		f.unavail--
	}
	f.mu.Unlock()
	f.rec(r)
	if fail {
		return nil, status.Error(codes.Unavailable, "not yet")
	}
	if _, err := os.Stat(filepath.Dir(r.GetTargetPath())); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the target's parent must exist: %v", err)
	}
	if err := os.Mkdir(r.GetTargetPath(), 0o750); err != nil && !os.IsExist(err) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.WriteFile(filepath.Join(r.GetTargetPath(), "file"), nil, 0o600); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (f *fakeDriver) NodeUnpublishVolume(_ context.Context, r *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	f.rec(r)
	if err := os.RemoveAll(r.GetTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (f *fakeDriver) NodeGetVolumeStats(_ context.Context, r *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	f.rec(r)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: f.capacity}}}, nil
}

func (f *fakeDriver) NodeExpandVolume(_ context.Context, r *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	f.rec(r)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: r.GetCapacityRange().GetRequiredBytes()}, nil
}

func serve(t *testing.T, f *fakeDriver) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	testutil.ServeGRPC(t, sock, func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, f)
		csi.RegisterControllerServer(s, f)
		csi.RegisterNodeServer(s, f)
	})
	return sock
}

// fakeRuntime records the mounts it is started with.
type fakeRuntime struct {
	mu      sync.Mutex
	started [][]co.Mount
	stopped int
}

func (r *fakeRuntime) Start(_ context.Context, _ *co.Pod, mounts []co.Mount) (co.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m.HostPath, "file")); err != nil {
			return nil, err // published before the runtime starts
		}
	}
	r.started = append(r.started, mounts)
	return fakeSandbox{r}, nil
}

type fakeSandbox struct{ r *fakeRuntime }

func (s fakeSandbox) Stop(context.Context) error {
	s.r.mu.Lock()
	s.r.stopped++
	s.r.mu.Unlock()
	return nil
}

func methods(calls []co.Call, keep func(string) bool) []string {
	var out []string
	for _, c := range calls {
		if keep(c.Method) {
			out = append(out, c.Method)
		}
	}
	return out
}

func volumeOps(m string) bool {
	return !strings.HasPrefix(m, "NodeGetCapabilities") && m != "GetPluginInfo" && m != "NodeGetInfo" &&
		m != "Probe" && m != "GetPluginCapabilities" && m != "ControllerGetCapabilities"
}

// TestKubeletOrder runs a pod with two volumes of one driver (with ControllerPublishVolume, with
// VOLUME_MOUNT_GROUP) and checks kubelet's order, paths and fields, stats, expansion, and the cleanup.
func TestKubeletOrder(t *testing.T) {
	f := &fakeDriver{name: "fake.csi.example", attach: true, mountGrp: true, nodeGrow: true, notReady: 2, unavail: 1}
	sock := serve(t, f)
	kubelet := t.TempDir()
	rt := &fakeRuntime{}
	c, err := co.New(co.Config{KubeletDir: kubelet, Runtimes: map[string]co.Runtime{"runc": rt}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := c.RegisterDriver(ctx, co.DriverConfig{NodeEndpoint: sock, PodInfoOnMount: true, ExtraCreateMetadata: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "fake.csi.example" || d.NodeID != "fake-node-id" {
		t.Fatalf("registered %q on %q", d.Name, d.NodeID)
	}
	sc := co.StorageClass{Driver: d, Parameters: map[string]string{co.FSTypeKey: "xfs", volume.DeferKey: "true",
		"csi.storage.k8s.io/provisioner-secret-name": "s"}, MountOptions: []string{"noatime"}}
	v, err := c.Provision(ctx, sc, co.Claim{Namespace: "ns", Name: "data", UID: "11111111-2222-4333-8444-555555555555", Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	cv := f.requests[0].(*csi.CreateVolumeRequest)
	wantParams := map[string]string{volume.DeferKey: "true", co.PVCNameKey: "data", co.PVCNamespaceKey: "ns", co.PVNameKey: "pvc-11111111-2222-4333-8444-555555555555"}
	if cv.GetName() != "pvc-11111111-2222-4333-8444-555555555555" || !reflect.DeepEqual(cv.GetParameters(), wantParams) ||
		cv.GetVolumeCapabilities()[0].GetMount().GetFsType() != "xfs" || cv.GetCapacityRange().GetRequiredBytes() != 1<<30 {
		t.Errorf("CreateVolume: %v", cv)
	}
	if v.Name != cv.GetName() || v.Handle != "vol-"+cv.GetName() || v.Attributes["from"] != "driver" ||
		!strings.HasSuffix(v.Attributes[co.ProvisionerIdentityKey], "-fake.csi.example") {
		t.Errorf("volume %+v", v)
	}

	gid := int64(2000)
	pod := &co.Pod{Namespace: "ns", Name: "web-0", FSGroup: &gid, Volumes: []co.PodVolume{{Volume: v, MountPath: "/data"}}}
	rp, err := c.RunPod(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(v.Handle))
	staging := filepath.Join(kubelet, "plugins/kubernetes.io/csi/fake.csi.example", hex.EncodeToString(sum[:]), "globalmount")
	target := filepath.Join(kubelet, "pods", pod.UID, "volumes/kubernetes.io~csi", v.Name, "mount")
	if c.StagingPath(v) != staging || rp.TargetPath(v) != target {
		t.Errorf("paths %s, %s", c.StagingPath(v), rp.TargetPath(v))
	}
	if len(rt.started) != 1 || !reflect.DeepEqual(rt.started[0], []co.Mount{{HostPath: target, ContainerPath: "/data"}}) {
		t.Errorf("runtime started with %v", rt.started)
	}
	for _, p := range []string{filepath.Join(filepath.Dir(staging), "vol_data.json"), filepath.Join(filepath.Dir(target), "vol_data.json")} {
		if _, err := os.Stat(p); err != nil {
			t.Error(err)
		}
	}
	var stage *csi.NodeStageVolumeRequest
	var pubs []*csi.NodePublishVolumeRequest
	for _, r := range f.requests {
		switch r := r.(type) {
		case *csi.NodeStageVolumeRequest:
			stage = r
		case *csi.NodePublishVolumeRequest:
			pubs = append(pubs, r)
		}
	}
	if stage.GetStagingTargetPath() != staging || stage.GetPublishContext()["lun"] != "7" ||
		stage.GetVolumeCapability().GetMount().GetVolumeMountGroup() != "2000" || stage.GetVolumeContext()[volume.PodNameKey] != "" ||
		!reflect.DeepEqual(stage.GetVolumeContext(), v.Attributes) {
		t.Errorf("NodeStageVolume: %v", stage)
	}
	if len(pubs) != 2 { // the first one was UNAVAILABLE and retried
		t.Fatalf("%d NodePublishVolume calls, want 2", len(pubs))
	}
	pub := pubs[1]
	wantCtx := map[string]string{"from": "driver", volume.DeferKey: "true", co.ProvisionerIdentityKey: v.Attributes[co.ProvisionerIdentityKey],
		volume.PodNameKey: "web-0", volume.PodNamespaceKey: "ns", volume.PodUIDKey: pod.UID, volume.ServiceAccountKey: "default",
		volume.EphemeralKey: "false"}
	if pub.GetTargetPath() != target || pub.GetStagingTargetPath() != staging || !reflect.DeepEqual(pub.GetVolumeContext(), wantCtx) ||
		pub.GetVolumeCapability().GetMount().GetVolumeMountGroup() != "2000" || pub.GetVolumeCapability().GetMount().GetFsType() != "xfs" ||
		!slices.Equal(pub.GetVolumeCapability().GetMount().GetMountFlags(), []string{"noatime"}) || pub.GetReadonly() {
		t.Errorf("NodePublishVolume: %v", pub)
	}

	st, err := c.VolumeStats(ctx, rp, v)
	if err != nil || st.GetUsage()[0].GetTotal() != 1<<30 {
		t.Errorf("stats %v, %v", st, err)
	}
	res, err := c.Expand(ctx, v, 2<<30)
	if err != nil || res.Capacity != 2<<30 || !res.NodeExpanded || res.NodeCapacity != 2<<30 {
		t.Errorf("expand: %+v, %v", res, err)
	}
	if err := c.StopPod(ctx, rp); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	want := []string{"CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume", "NodePublishVolume",
		"NodeGetVolumeStats", "ControllerExpandVolume", "NodeExpandVolume", "NodeUnpublishVolume", "NodeUnstageVolume",
		"ControllerUnpublishVolume", "DeleteVolume"}
	if got := methods(c.Calls(), volumeOps); !slices.Equal(got, want) {
		t.Errorf("calls\n%v\nwant\n%v", got, want)
	}
	for _, r := range f.requests {
		switch r := r.(type) {
		case *csi.NodeGetVolumeStatsRequest:
			if r.GetVolumePath() != target || r.GetStagingTargetPath() != "" {
				t.Errorf("NodeGetVolumeStats: %v", r)
			}
		case *csi.NodeExpandVolumeRequest:
			if r.GetVolumePath() != target || r.GetStagingTargetPath() != staging || r.GetCapacityRange().GetRequiredBytes() != 2<<30 ||
				r.GetVolumeCapability().GetMount().GetFsType() != "xfs" {
				t.Errorf("NodeExpandVolume: %v", r)
			}
		case *csi.ControllerPublishVolumeRequest:
			if r.GetNodeId() != "fake-node-id" || r.GetVolumeId() != v.Handle {
				t.Errorf("ControllerPublishVolume: %v", r)
			}
		}
	}
	if rt.stopped != 1 {
		t.Errorf("runtime stopped %d times", rt.stopped)
	}
	left, _ := filepath.Glob(filepath.Join(kubelet, "pods", "*"))
	left2, _ := filepath.Glob(filepath.Join(kubelet, "plugins/kubernetes.io/csi/fake.csi.example/*"))
	if len(left)+len(left2) > 0 {
		t.Errorf("left behind: %v %v", left, left2)
	}
}

// TestSharedStagingAndOwnership: two pods share a staged volume (one stage, one unstage after the last
// pod); without ControllerPublishVolume nothing is attached; without VOLUME_MOUNT_GROUP the simulator
// applies fsGroup itself under fsGroupPolicy File, and an expansion with no pod waits for the next publish.
func TestSharedStagingAndOwnership(t *testing.T) {
	f := &fakeDriver{name: "plain.csi.example", nodeGrow: true}
	sock := serve(t, f)
	rt := &fakeRuntime{}
	c, err := co.New(co.Config{KubeletDir: t.TempDir(), RuntimeClasses: map[string]string{"vm": "vmm"},
		Runtimes: map[string]co.Runtime{"vmm": rt}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := c.RegisterDriver(ctx, co.DriverConfig{NodeEndpoint: sock, FSGroupPolicy: co.FSGroupPolicyFile})
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Provision(ctx, co.StorageClass{Driver: d}, co.Claim{Namespace: "ns", Name: "c", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunPod(ctx, &co.Pod{Namespace: "ns", Name: "x", Volumes: []co.PodVolume{{Volume: v, MountPath: "/d"}}}); err == nil ||
		!strings.Contains(err.Error(), `no runtime for handler "runc"`) {
		t.Errorf("a pod with no runtime: %v", err)
	}
	res, err := c.Expand(ctx, v, 2<<20)
	if err != nil || !res.NodePending || res.NodeExpanded {
		t.Errorf("expand with no pod: %+v %v", res, err)
	}
	gid := int64(os.Getgid())
	var pods []*co.RunningPod
	for _, name := range []string{"a", "b"} {
		rp, err := c.RunPod(ctx, &co.Pod{Namespace: "ns", Name: name, RuntimeClassName: "vm", FSGroup: &gid,
			Volumes: []co.PodVolume{{Volume: v, MountPath: "/d"}}})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, rp)
		fi, err := os.Stat(rp.TargetPath(v))
		if err != nil || fi.Mode()&os.ModeSetgid == 0 || fi.Mode().Perm()&0o070 != 0o070 {
			t.Errorf("fsGroup not applied by the CO: %v %v", fi.Mode(), err)
		}
	}
	for _, rp := range pods {
		if err := c.StopPod(ctx, rp); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"CreateVolume", "ControllerExpandVolume", "NodeStageVolume", "NodePublishVolume", "NodeExpandVolume",
		"NodePublishVolume", "NodeUnpublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"}
	if got := methods(c.Calls(), volumeOps); !slices.Equal(got, want) {
		t.Errorf("calls\n%v\nwant\n%v", got, want)
	}
	for _, r := range f.requests {
		if p, ok := r.(*csi.NodePublishVolumeRequest); ok {
			if p.GetVolumeContext()[volume.PodNameKey] != "" || p.GetVolumeCapability().GetMount().GetVolumeMountGroup() != "" {
				t.Errorf("no podInfoOnMount and no VOLUME_MOUNT_GROUP, yet %v", p)
			}
		}
	}
}

// TestHostRuntime: runc needs a mounted filesystem at the target path.
func TestHostRuntime(t *testing.T) {
	dir := t.TempDir()
	_, err := co.Host{}.Start(context.Background(), &co.Pod{}, []co.Mount{{HostPath: dir, ContainerPath: "/data"}})
	if err == nil || !strings.Contains(err.Error(), "empty directory") {
		t.Errorf("an unmounted target: %v", err)
	}
	sb, err := co.Host{}.Start(context.Background(), &co.Pod{}, []co.Mount{{HostPath: "/proc", ContainerPath: "/data"}})
	if err != nil {
		t.Fatal(err)
	}
	hs := sb.(*co.HostSandbox)
	if hs.Mounts[0].FSType != "proc" || hs.Path("/data/self/x") != "/proc/self/x" || hs.Path("/other") != "" {
		t.Errorf("%+v", hs.Mounts)
	}
}

func TestSandboxName(t *testing.T) {
	for _, c := range []struct{ name, uid, want string }{
		{"db-0", "3c9e0f1a-0000-4000-8000-00000000e2e1", "db-0-3c9e0f1a"},
		{"a-very-long-pod-name", "abcdef12-0000", "a-very-long-abcdef12"},
		{"_x", "12345678", "pod_x-12345678"},
	} {
		if got := co.SandboxName(&co.Pod{Name: c.name, UID: c.uid}); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	if u := co.NewUID(); len(u) != 36 || u[14] != '4' || strings.Count(u, "-") != 4 {
		t.Errorf("uid %s", u)
	}
}
