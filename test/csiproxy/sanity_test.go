// Package csiproxy_test runs csi-sanity (pinned in tools/csisanity) against crust-csi-proxy, the real
// binary, in front of crust's reference LVM driver (deferral off in the driver: it is the unmodified
// driver), with a real crustd binary:
//
//   - driver: csi-sanity straight at the driver, the baseline;
//   - proxy: csi-sanity at the proxy, volumes without crust.dev/defer: everything passes through, and the
//     result must be the baseline's, test for test;
//   - deferred: csi-sanity at the proxy with crust.dev/defer: "true" in the test volume parameters, and
//     its controller calls at crust-csi-proxy --controller, which keeps the parameter from the driver, asks
//     for block volumes and puts the flag in the volume context, so every mount volume is staged as raw
//     block and published deferred. Between csi-sanity and the proxy sits a stand-in for the runtime: after a NodePublishVolume
//     that crustd now holds, a sandbox claims the volume and mounts it (internal/testutil/sandbox), and before
//     NodeUnpublishVolume it lets go, as a pod's sandbox starts after kubelet publishes and stops before
//     kubelet unpublishes. Stats and expansion of those volumes go proxy, crustd, sandbox;
//   - unclaimed: the deferred run with csi-sanity straight at the proxy and no sandbox ever claiming a
//     volume: crustd answers stats from the device and records expansions for the sandbox's mount.
//
// In the other runs the Controller service goes to the node proxy, through its raw forwarding.
//
// A test that passes against the driver and does not pass in a proxied run fails the test unless
// deferralExceptions lists it with its reason. It needs root and lvm2; other users skip it.
package csiproxy_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/internal/testutil/sandbox"
	"crust.dev/crust/test/csisanity/sanityrun"
)

// deferralExceptions lists csi-sanity tests that pass against the driver but are expected not to pass in
// the deferred run, each with its reason. Empty: under deferral every test that passes against the driver
// passes too (csi-sanity checks the target path's existence and kind, never a mounted filesystem, and the
// sandbox stand-in answers stats and expansion).
var deferralExceptions = map[string]string{}

const (
	volumeSize = 64 << 20
	expandSize = 128 << 20
	vgSize     = 8 << 30
)

var binDir, moduleRoot string

func TestMain(m *testing.M) {
	harness.RootMain(m, "csiproxy", "LVM on loop devices, mounts", runMain)
}

func runMain(m *testing.M) int {
	root, err := harness.FindModuleRoot()
	if err != nil {
		fmt.Println("go env GOMOD:", err)
		return 1
	}
	moduleRoot = root
	dir, err := os.MkdirTemp("", "csiproxy-bin")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := harness.Build(dir, "crust.dev/crust/cmd/crustd", "crust.dev/crust/cmd/crust-csi-proxy"); err != nil {
		fmt.Println("build:", err)
		return 1
	}
	binDir = dir
	// Build csi-sanity now, so that its build does not count in a run's time; `go tool` caches it.
	if err := sanityrun.Build(moduleRoot); err != nil {
		fmt.Println(err)
		return 1
	}
	return m.Run()
}

// start starts a binary of binDir and waits until it is ready.
func start(t *testing.T, bin string, ready func(context.Context, <-chan struct{}) error, args ...string) *harness.Proc {
	t.Helper()
	return harness.StartProc(t, harness.ProcConfig{Bin: filepath.Join(binDir, bin), Args: args, Ready: ready})
}

// outcome is one csi-sanity run: test name to "passed", "failed" or "skipped: <reason>".
type outcome map[string]string

func TestCSISanityThroughProxy(t *testing.T) {
	base := runSanity(t, "driver")
	t.Run("proxy", func(t *testing.T) {
		got := runSanity(t, "proxy")
		compare(t, base, got, nil)
	})
	t.Run("deferred", func(t *testing.T) {
		got := runSanity(t, "deferred")
		compare(t, base, got, deferralExceptions)
	})
	t.Run("unclaimed", func(t *testing.T) {
		got := runSanity(t, "unclaimed")
		compare(t, base, got, deferralExceptions)
	})
}

// compare fails t unless got has the baseline's result for every test (exceptions aside, with reasons).
func compare(t *testing.T, base, got outcome, exceptions map[string]string) {
	t.Helper()
	names := make([]string, 0, len(base))
	for n := range base {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if got[n] == base[n] {
			continue
		}
		if why, ok := exceptions[n]; ok {
			t.Logf("expected difference (%s): %s: %s alone, %s here", why, n, base[n], got[n])
			continue
		}
		t.Errorf("%s: %q against the driver, %q through the proxy", n, base[n], got[n])
	}
	for n, r := range got {
		if _, ok := base[n]; !ok {
			t.Errorf("%s: %q through the proxy, not run against the driver", n, r)
		}
	}
}

// runSanity sets up a node for one mode and runs csi-sanity against it.
func runSanity(t *testing.T, mode string) outcome {
	t.Helper()
	dir := testutil.SocketDir(t)
	kubelet := filepath.Join(dir, "kubelet")
	if err := os.MkdirAll(kubelet, 0o750); err != nil {
		t.Fatal(err)
	}
	vg := lvmtest.New(t, vgSize)
	driverSock := filepath.Join(dir, "driver.sock")
	driverLog, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := lvmdriver.Start(driverSock, lvmdriver.Config{VG: vg.Name, Devices: []string{vg.Device}, NodeID: "sanity-node",
		StateDir: filepath.Join(dir, "driver"), Log: slog.New(slog.NewTextHandler(driverLog, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop driver: %v", err)
		}
		if left, err := vg.LVs(); err != nil || len(left) > 0 {
			t.Errorf("volumes left in the volume group: %v (%v)", left, err)
		}
	})

	endpoint, controller := driverSock, driverSock
	var params string
	var crust crustv1.VolumeServiceClient
	var proxy, crustdProc *harness.Proc
	deferred := mode == "deferred" || mode == "unclaimed"
	if mode != "driver" {
		crustSock, proxySock := filepath.Join(dir, "crust.sock"), filepath.Join(dir, "csi.sock")
		crustdProc = start(t, "crustd", harness.Serving(crustSock), "--socket", crustSock, "--state-dir", filepath.Join(dir, "crustd"),
			"--kata-dir", "", "--kubelet-dir", kubelet, "--http-addr", "")
		proxy = start(t, "crust-csi-proxy", harness.AnswersCSI(proxySock), "--csi-address", proxySock, "--driver-address", driverSock,
			"--crust-socket", crustSock, "--state-dir", filepath.Join(dir, "proxy"), "--log-level", "debug")
		cc, err := crustd.Dial(crustSock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		crust = crustv1.NewVolumeServiceClient(cc)
		endpoint, controller = proxySock, proxySock
		if deferred {
			params = filepath.Join(dir, "params.yaml")
			if err := os.WriteFile(params, []byte(`crust.dev/defer: "true"`+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if mode == "deferred" {
				endpoint = serveRuntimeStandIn(t, filepath.Join(dir, "kubelet-side.sock"), proxySock, crustSock, crust)
			}
			// The controller side through crust-csi-proxy --controller, as deploy/ puts it: it keeps the
			// class's crust.dev/defer from the driver, asks for block, and puts the flag in the volume
			// context the node proxy reads.
			ctrlSock := filepath.Join(dir, "controller.sock")
			start(t, "crust-csi-proxy", harness.AnswersCSI(ctrlSock), "--controller", "--csi-address", ctrlSock, "--driver-address",
				driverSock, "--log-level", "debug")
			controller = ctrlSock
		}
	}

	report, err := sanityrun.Run(sanityrun.Config{
		ModuleRoot: moduleRoot, Endpoint: endpoint, ControllerEndpoint: controller,
		StagingDir: filepath.Join(kubelet, "staging"), MountDir: filepath.Join(kubelet, "mount"),
		VolumeSize: volumeSize, ExpandSize: expandSize, ParametersFile: params, JUnit: filepath.Join(dir, "junit.xml"),
	})
	if report == nil {
		t.Fatal(err)
	}
	out, runErr, elapsed := report.Output, report.RunErr, report.Elapsed
	if err != nil {
		t.Fatalf("csi-sanity: %v (run: %v)\n%s", err, runErr, sanityrun.Tail(out, 60))
	}
	res := outcome(sanityrun.Outcomes(report.Results))
	var passed, failed, skipped int
	reasons := map[string]int{}
	for n, r := range res {
		switch {
		case r == "passed":
			passed++
		case strings.HasPrefix(r, "skipped"):
			skipped++
			reasons[strings.TrimPrefix(strings.TrimPrefix(r, "skipped: "), "skipped - ")]++
		default:
			failed++
			t.Logf("failed: %s", n)
		}
	}
	t.Logf("csi-sanity %s: %d passed, %d failed, %d skipped in %s", mode, passed, failed, skipped, elapsed.Round(100*time.Millisecond))
	if mode == "driver" {
		// The driver's own skips: capabilities it does not advertise. A proxied run must skip the same.
		keys := make([]string, 0, len(reasons))
		for k := range reasons {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			t.Logf("  skipped %2d: %s", reasons[k], k)
		}
	}
	if passed == 0 {
		t.Errorf("csi-sanity passed nothing (exit %v):\n%s", runErr, sanityrun.Tail(out, 60))
	}
	if mode == "deferred" {
		deferredVolumesSeen(t, dir)
	}
	if mode == "unclaimed" {
		// The node expansion test expanded a deferred volume that no sandbox had claimed.
		if n := strings.Count(crustdProc.Log(), "expansion before any claim recorded"); n == 0 {
			t.Errorf("crustd recorded no expansion before a claim in the unclaimed run")
		} else {
			t.Logf("crustd recorded %d expansions before a claim", n)
		}
	}
	if deferred {
		if n := strings.Count(proxy.Log(), "decision=defer"); n == 0 {
			t.Errorf("the proxy deferred no publish in the deferred run")
		} else {
			t.Logf("the proxy deferred %d publishes", n)
		}
	}
	if crust != nil {
		l, err := crust.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{})
		if err != nil || len(l.GetVolumes()) != 0 {
			t.Errorf("descriptors left in crustd: %v (%v)", l.GetVolumes(), err)
		}
		if names, _ := os.ReadDir(filepath.Join(dir, "proxy", "records")); len(names) != 0 {
			t.Errorf("proxy records left: %v", names)
		}
	}
	if t.Failed() {
		b, _ := os.ReadFile(driverLog.Name())
		t.Logf("driver log (tail):\n%s", sanityrun.Tail(b, 40))
	}
	return res
}

// deferredVolumesSeen checks that the deferred run really deferred: the stand-in claimed volumes.
func deferredVolumesSeen(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "claims"))
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		t.Errorf("no volume was deferred and claimed in the deferred run (%v)", err)
		return
	}
	t.Logf("the runtime stand-in claimed %d deferred volumes", len(strings.Split(strings.TrimSpace(string(b)), "\n")))
}

// standIn is what kubelet and the runtime do around the proxy, for csi-sanity: Identity and Node calls are
// forwarded to the proxy; after a NodePublishVolume whose target crustd holds, a sandbox claims and mounts
// the volume; before a NodeUnpublishVolume, the sandbox lets go of it.
type standIn struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	cc     *grpc.ClientConn
	node   csi.NodeClient
	crust  crustv1.VolumeServiceClient
	sb     *sandbox.Sandbox
	claims *os.File
}

func serveRuntimeStandIn(t *testing.T, sock, proxySock, crustSock string, crust crustv1.VolumeServiceClient) string {
	t.Helper()
	cc, err := crustd.Dial(proxySock)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := os.Create(filepath.Join(filepath.Dir(sock), "claims"))
	if err != nil {
		t.Fatal(err)
	}
	s := &standIn{cc: cc, node: csi.NewNodeClient(cc), crust: crust,
		sb: sandbox.New(t, crustSock, "sanity-sandbox"), claims: claims}
	l, err := listenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.passThrough))
	csi.RegisterIdentityServer(srv, s)
	csi.RegisterNodeServer(srv, s)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); _ = cc.Close(); _ = claims.Close() })
	return sock
}

// passThrough forwards every call but a publish and an unpublish to the proxy as it came.
func (s *standIn) passThrough(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod == csi.Node_NodePublishVolume_FullMethodName || info.FullMethod == csi.Node_NodeUnpublishVolume_FullMethodName {
		return handler(ctx, req)
	}
	service, method := path.Split(strings.TrimPrefix(info.FullMethod, "/"))
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(strings.TrimSuffix(service, "/")))
	if err != nil {
		return nil, err
	}
	out, err := protoregistry.GlobalTypes.FindMessageByName(d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method)).Output().FullName())
	if err != nil {
		return nil, err
	}
	resp := out.New().Interface()
	return resp, s.cc.Invoke(ctx, info.FullMethod, req, resp)
}

func (s *standIn) NodePublishVolume(ctx context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	resp, err := s.node.NodePublishVolume(ctx, r)
	if err != nil || s.sb.Holds(r.GetTargetPath()) {
		return resp, err
	}
	if _, gerr := s.crust.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: r.GetTargetPath()}); gerr == nil {
		s.sb.Start(r.GetTargetPath())
		_, _ = fmt.Fprintln(s.claims, r.GetTargetPath())
	}
	return resp, nil
}

func (s *standIn) NodeUnpublishVolume(ctx context.Context, r *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	s.sb.Stop(r.GetTargetPath())
	return s.node.NodeUnpublishVolume(ctx, r)
}
