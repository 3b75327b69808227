package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
	"crust.dev/crust/internal/csiproxy"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/benchfig"
	"crust.dev/crust/internal/testutil/harness"
)

// BenchmarkPublishToMounted measures time to volume as kubelet starts it: from NodePublishVolume on
// crust-csi-proxy (in this process, with no kubeconfig, so it defers every volume whose volume context
// asks) in front of the reference LVM driver (crust-lvm-csi, a process of its own, on a throw-away volume
// group), to the volume mounted in the guest of a running crust-microvm sandbox (handler.Run in this
// process, its VM under TCG) that waits on the publish target: the moment the handler logs "volume
// mounted" for it. In between, the proxy publishes the logical volume raw and deposits the descriptor with
// crustd; the handler claims it, hot-plugs it, formats it in the guest (a fresh volume is blank) and
// mounts it. Each op first creates the volume through the driver's controller with crust.dev/defer in the
// class parameters and stages it through the proxy, untimed, as the CSI controller and kubelet's staging
// would before the pod's publish. ns/op is the publish-to-mounted time. Reported per op besides, as means:
// overhead-ms (over the bare path), publish-call-ms (the NodePublishVolume call: the driver's raw
// publish and the descriptor deposited with crustd) and publish-to-pickup-ms (what comes before the
// handler starts its claim, as it times that itself: the call and crustd's watch event).
//
// Side by side, as BenchmarkStageToMounted does it (the same batches of VMs, alternating which goes
// first), the bare path on the same kind of device: each op also creates a second volume of the same size
// through the driver and has the driver publish it raw, straight (no proxy), untimed for the bare path;
// its device is hot-plugged with vm.AttachBlock and mounted by the agent with create_filesystem, so that
// both sides format a blank logical volume in the guest. The volumes of a batch are unpublished, unstaged
// and deleted through the proxy and the driver once its sandbox has stopped.
//
// The floor of any proxy in front of an unmodified driver is the bare path plus the driver's own raw
// publish, which the proxy needs for the device: the raw publish of the bare side's volume is timed
// (vm/driver-raw-publish), and crust's time is reported over the bare side's plus that publish
// (vm/time-to-volume-from-proxy-vs-bare-and-publish).
func BenchmarkPublishToMounted(b *testing.B) {
	g := guest(b, "cloud")
	// The proxy hands crustd the logical volume's device: a device-mapper node, or where device-mapper is
	// missing a loop device over the driver's extent map.
	d := startCrustd(b, "--device-allow", "/dev/loop*,/dev/dm-*")
	n := startProxyNode(b, d, 2*sandboxVolumes*volumeSize+64<<20)
	work := b.TempDir()

	var callT, rawT []time.Duration
	var pubs, raws []published
	r := timeToVolume(b, d, g, ttvOps{name: "pub", create: true,
		prepare: func(_ *batch, target string) (string, func(context.Context)) {
			pub := n.stage(b, fmt.Sprintf("pvc-bench-%d", len(callT)), target)
			pubs = append(pubs, pub.published)
			raw, took := n.publishRaw(b, fmt.Sprintf("pvc-bare-%d", len(callT)), work)
			raws, rawT = append(raws, raw), append(rawT, took)
			return raw.target, func(ctx context.Context) {
				t0 := time.Now()
				if _, err := n.node.NodePublishVolume(ctx, pub.req); err != nil {
					b.Fatalf("NodePublishVolume through the proxy: %v\nproxy log:\n%s", err, n.log)
				}
				callT = append(callT, time.Since(t0))
			}
		},
		afterBatch: func() {
			n.release(b, pubs, n.node)
			n.release(b, raws, n.driver)
			pubs, raws = nil, nil
		},
	})
	r.record(b, "vm/time-to-volume-from-proxy", "NodePublishVolume on crust-csi-proxy to the fresh volume formatted and mounted in a running guest",
		"a blank volume of the same driver and size, published raw, hot-plugged, formatted and mounted by hand")
	if len(callT) == 0 {
		return
	}
	b.Logf("the NodePublishVolume call, ms by op: %s", msList(callT))
	b.Logf("the driver's raw publish, called straight, ms by op: %s", msList(rawT))
	if len(rawT) == len(r.crust) {
		floor := make([]float64, len(r.crust))
		for i := range floor {
			floor[i] = float64(r.crust[i]) / float64(r.bare[i]+rawT[i])
		}
		benchfig.Record(b, benchfig.Figure{Name: "vm/time-to-volume-from-proxy-vs-bare-and-publish", Unit: "x", Samples: floor,
			About: "NodePublishVolume on crust-csi-proxy to the volume mounted in the guest / the bare path plus the driver's " +
				"own raw publish of the bare side's volume: the floor of a proxy in front of an unmodified driver, per op"})
		benchfig.Record(b, benchfig.Figure{Name: "vm/driver-raw-publish", Unit: "ms", Samples: msEach(rawT),
			About: "the reference driver's NodePublishVolume of a block volume, called straight (no proxy)"})
	}
	b.ReportMetric(ms(mean(callT)), "publish-call-ms/op")
	if len(r.took) == len(r.crust) {
		b.Logf("the handler's claim, hot-plug, format and mount, ms by op: %s", msList(r.took))
		b.ReportMetric(ms(mean(r.crust)-mean(r.took)), "publish-to-pickup-ms/op")
	}
}

// proxyNode is the node side of a cluster as kubelet sees it: crust-lvm-csi on a throw-away volume group,
// and crust-csi-proxy in front of it and of crustd.
type proxyNode struct {
	d          *daemon
	driverName string
	ctrl       csi.ControllerClient // the driver's own
	driver     csi.NodeClient       // the driver's own
	node       csi.NodeClient       // the proxy's
	log        *harness.SyncBuffer  // the proxy's
}

// published is a volume staged (and maybe published) through the proxy.
type published struct {
	volumeID, staging, target string
}

// publishing is a staged volume and the publish kubelet would send for it.
type publishing struct {
	published
	req *csi.NodePublishVolumeRequest
}

// startProxyNode makes a volume group of vgSize bytes, runs the driver on it and the proxy in front of it,
// all stopped (and the volume group removed) at cleanup.
func startProxyNode(b *testing.B, d *daemon, vgSize int64) *proxyNode {
	b.Helper()
	vg := lvmtest.New(b, vgSize)
	dir := testutil.SocketDir(b)
	driverSock, proxySock := filepath.Join(dir, "driver.sock"), filepath.Join(dir, "csi.sock")
	// Deferral is the proxy's here: the driver runs without crustd's socket, as any driver would.
	harness.StartProc(b, harness.ProcConfig{Bin: program(b, "crust.dev/crust/examples/lvm-csi/cmd/crust-lvm-csi"),
		Args: []string{"--endpoint", driverSock, "--vg", vg.Name, "--pv", vg.Device, "--state-dir", filepath.Join(dir, "driver"),
			"--crust-socket", ""},
		Ready: harness.AnswersCSI(driverSock), StopMustSucceed: true})

	n := &proxyNode{d: d, driverName: lvmdriver.DefaultName, log: &harness.SyncBuffer{}}
	log := slog.New(slog.NewTextHandler(n.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := csiproxy.Config{CSIAddress: proxySock, DriverAddress: driverSock, CrustSocket: d.socket,
		StateDir: filepath.Join(dir, "proxy"), PodWait: time.Second, LockWait: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done, exited := make(chan error, 1), make(chan struct{})
	go func() { done <- csiproxy.Run(ctx, cfg, log, csiproxy.Deps{}); close(exited) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("proxy: %v\nproxy log:\n%s", err, n.log)
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	if err := harness.WaitCSI(wctx, proxySock, exited); err != nil {
		b.Fatalf("the proxy did not come up: %v\nproxy log:\n%s", err, n.log)
	}
	for sock, set := range map[string]func(*grpc.ClientConn){
		driverSock: func(cc *grpc.ClientConn) { n.ctrl, n.driver = csi.NewControllerClient(cc), csi.NewNodeClient(cc) },
		proxySock:  func(cc *grpc.ClientConn) { n.node = csi.NewNodeClient(cc) },
	} {
		cc, err := crustd.Dial(sock)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cc.Close() })
		set(cc)
	}
	return n
}

// ext4Mount is the capability of a filesystem volume, as a PVC of volumeMode Filesystem asks it.
func ext4Mount() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// stage creates volume name of volumeSize bytes through the driver's controller, of a class that asks for
// deferral, stages it through the proxy at kubelet's staging path for the volume of target (a
// kubelet-shaped publish target), and returns the publish kubelet would then send.
func (n *proxyNode) stage(b *testing.B, name, target string) publishing {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := n.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{ext4Mount()}, Parameters: map[string]string{csiproxy.DeferKey: "true"}})
	if err != nil {
		b.Fatalf("CreateVolume: %v", err)
	}
	vol := r.GetVolume()
	if !csiproxy.DeferRequested(vol.GetVolumeContext()) {
		b.Fatalf("the driver's volume context %v does not ask for deferral", vol.GetVolumeContext())
	}
	pv := filepath.Base(filepath.Dir(target))
	staging := filepath.Join(n.d.KubeletDir, "plugins", "kubernetes.io", "csi", n.driverName, pv, "globalmount")
	if err := os.MkdirAll(staging, 0o750); err != nil { // kubelet makes it
		b.Fatal(err)
	}
	if _, err := n.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: ext4Mount(), VolumeContext: vol.GetVolumeContext()}); err != nil {
		b.Fatalf("NodeStageVolume through the proxy: %v\nproxy log:\n%s", err, n.log)
	}
	return publishing{published: published{volumeID: vol.GetVolumeId(), staging: staging, target: target},
		req: &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: ext4Mount(), VolumeContext: vol.GetVolumeContext()}}
}

// publishRaw creates volume name of volumeSize bytes through the driver's controller, stages it and
// publishes it as a raw block device at a file in dir, straight to the driver, as the proxy has the driver
// do for a deferred volume, and returns it with how long the publish took.
func (n *proxyNode) publishRaw(b *testing.B, name, dir string) (published, time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: ext4Mount().GetAccessMode()}
	r, err := n.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{block}})
	if err != nil {
		b.Fatalf("CreateVolume: %v", err)
	}
	vol := r.GetVolume()
	v := published{volumeID: vol.GetVolumeId(), staging: filepath.Join(dir, name+"-staging"), target: filepath.Join(dir, name)}
	if err := os.MkdirAll(v.staging, 0o750); err != nil {
		b.Fatal(err)
	}
	if _, err := n.driver.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.volumeID, StagingTargetPath: v.staging,
		VolumeCapability: block, VolumeContext: vol.GetVolumeContext()}); err != nil {
		b.Fatalf("NodeStageVolume: %v", err)
	}
	t0 := time.Now()
	if _, err := n.driver.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.volumeID, StagingTargetPath: v.staging,
		TargetPath: v.target, VolumeCapability: block, VolumeContext: vol.GetVolumeContext()}); err != nil {
		b.Fatalf("NodePublishVolume: %v", err)
	}
	return v, time.Since(t0)
}

// release unpublishes and unstages vols through node (the proxy, or the driver straight) and deletes them
// through the driver, as kubelet and the controller do once their pod is gone (its sandbox stopped).
func (n *proxyNode) release(b *testing.B, vols []published, node csi.NodeClient) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, v := range vols {
		if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.volumeID, TargetPath: v.target}); err != nil {
			b.Errorf("NodeUnpublishVolume %s: %v", v.target, err)
		}
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.volumeID, StagingTargetPath: v.staging}); err != nil {
			b.Errorf("NodeUnstageVolume %s: %v", v.staging, err)
		}
		if _, err := n.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.volumeID}); err != nil {
			b.Errorf("DeleteVolume %s: %v", v.volumeID, err)
		}
	}
}
