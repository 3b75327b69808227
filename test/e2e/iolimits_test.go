package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/test/co"
)

// TestMicroVMIOLimits: a volume context with crust's I/O limit keys (1 MiB/s of writes, 50 operations a
// second), as the reference driver hands a StorageClass's parameters to the node, is deposited through
// api/client into a real crustd and mounted by crust-microvm in a TCG guest beside a volume without
// limits. In the guest, direct writes (dd oflag=direct) and direct 4 KiB reads (iflag=direct) of the
// limited volume run at most at the limits, with QEMU's burst of a tenth of a second and one request
// allowed, and at least at half of them; the same work on the other volume is at least three times
// faster. Limits crustd must refuse (a total beside a read limit) are INVALID_ARGUMENT naming the field,
// and nothing is deposited.
func TestMicroVMIOLimits(t *testing.T) {
	const (
		writeLimit = 1 << 20 // bytes a second
		opsLimit   = 50      // operations a second
		writeBS    = 64 << 10
		writeCount = 48  // 3 MiB: about 3 s at the limit
		readCount  = 150 // 4 KiB reads: about 3 s at the limit
	)
	d, assets := newMicroVMDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	crust, err := client.New(d.socket, client.WithDriverName("e2e.crust.dev"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = crust.Close() }()

	const uid = "3c9e0f1a-0000-4000-8000-00000000e2f1"
	mount := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	type vol struct{ target, guest, dev string }
	limited := vol{target: d.podTarget(uid, "pvc-limited"), guest: "/data/limited"}
	plain := vol{target: d.podTarget(uid, "pvc-plain"), guest: "/data/plain"}
	publish := func(v vol, volCtx map[string]string) error {
		_, err := crust.Publish(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-" + v.guest[6:], TargetPath: v.target,
			VolumeCapability: mount, VolumeContext: volCtx}, v.dev)
		return err
	}
	for _, v := range []*vol{&limited, &plain} {
		v.dev = loopDevice(t, 128<<20)
		// Formatted on the host whole, so that nothing of mkfs runs in the guest during the measurements.
		harness.Run(t, "mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", v.dev)
	}

	// Limits that break a rule: api/client's builder (the one a driver and the proxy share) refuses them
	// before anything reaches crustd, naming the StorageClass parameter, and nothing is deposited.
	err = publish(limited, map[string]string{volume.DeferKey: "true", volume.TotalIOPSKey: "50", volume.ReadIOPSKey: "5"})
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), volume.ReadIOPSKey) {
		t.Fatalf("publish with total and read IOPS: %v, want INVALID_ARGUMENT naming %s", err, volume.ReadIOPSKey)
	}
	if _, err := crust.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: limited.target}); status.Code(err) != codes.NotFound {
		t.Fatalf("after a refused publish: %v, want NOT_FOUND", err)
	}

	if err := publish(limited, map[string]string{volume.DeferKey: "true", volume.WriteBytesPerSecondKey: "1Mi",
		volume.TotalIOPSKey: strconv.Itoa(opsLimit), volume.PodUIDKey: uid}); err != nil {
		t.Fatal(err)
	}
	if err := publish(plain, map[string]string{volume.DeferKey: "true", volume.PodUIDKey: uid}); err != nil {
		t.Fatal(err)
	}
	if got, want := getVolume(t, d, limited.target).GetSpec().GetIoLimits(), (&crustv1.IOLimits{TotalIops: opsLimit, WriteBytesPerSecond: writeLimit}); !proto.Equal(got, want) {
		t.Fatalf("descriptor io_limits %v, want %v", got, want)
	}
	if got := getVolume(t, d, plain.target).GetSpec().GetIoLimits(); got != nil {
		t.Fatalf("descriptor without limits has io_limits %v", got)
	}

	m := startMicroVM(t, d, assets, t.TempDir(), "e2e-iolimits", limited.target+":"+limited.guest, plain.target+":"+plain.guest)
	for _, v := range []vol{limited, plain} {
		if err := <-m.WaitMountedAsync(v.guest); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.WaitLogValue("volume mounted", "io_limits", "target="+limited.target); got == "" {
		t.Errorf("the handler's log does not show the limits it applied")
	}

	// seconds runs a shell command in the guest and returns how long it took by the guest's clock.
	seconds := func(cmd string) float64 {
		t.Helper()
		out := m.ExecOK("sh", "-c", fmt.Sprintf("a=$(cut -d' ' -f1 /proc/uptime); %s || exit 1; b=$(cut -d' ' -f1 /proc/uptime); echo $a $b", cmd))
		f := strings.Fields(out)
		a, errA := strconv.ParseFloat(f[0], 64)
		b, errB := strconv.ParseFloat(f[len(f)-1], 64)
		if errA != nil || errB != nil {
			t.Fatalf("guest clock: %q", out)
		}
		return max(b-a, 0.01) // /proc/uptime counts hundredths
	}
	type rates struct{ write, read float64 } // bytes a second, operations a second
	measure := func(v vol) rates {
		t.Helper()
		dev := m.ExecOK("sh", "-c", fmt.Sprintf("awk '$2 == %q {print $1}' /proc/mounts", v.guest))
		w := seconds(fmt.Sprintf("dd if=/dev/zero of=%s/w bs=%d count=%d oflag=direct conv=fsync 2>/dev/null", v.guest, writeBS, writeCount))
		r := seconds(fmt.Sprintf("dd if=%s of=/dev/null bs=4k count=%d iflag=direct 2>/dev/null", dev, readCount))
		return rates{write: writeBS * writeCount / w, read: readCount / r}
	}
	lim, free := measure(limited), measure(plain)
	const mibF = 1 << 20
	t.Logf("in the guest (TCG), limited to 1 MiB/s of writes and %d operations/s: writes %.2f MiB/s, 4 KiB reads %.1f/s; "+
		"without limits: writes %.2f MiB/s (%.0fx), reads %.1f/s (%.0fx)",
		opsLimit, lim.write/mibF, lim.read, free.write/mibF, free.write/lim.write, free.read, free.read/lim.read)

	// The limit with QEMU's burst (a tenth of a second's worth) and one request in flight, over the time
	// the work took at the limit, and 5% for the clock's hundredths.
	writeTime := float64(writeBS*writeCount) / writeLimit
	maxWrite := (writeLimit*writeTime + writeLimit/10 + writeBS) / writeTime * 1.05
	readTime := float64(readCount) / opsLimit
	maxRead := (opsLimit*readTime + opsLimit/10 + 1) / readTime * 1.05
	if lim.write > maxWrite || lim.write < writeLimit/2 {
		t.Errorf("limited writes ran at %.0f B/s, want at most %.0f and at least half of %d", lim.write, maxWrite, writeLimit)
	}
	if lim.read > maxRead || lim.read < opsLimit/2 {
		t.Errorf("limited reads ran at %.1f/s, want at most %.1f and at least half of %d", lim.read, maxRead, opsLimit)
	}
	if free.write < 3*writeLimit || free.read < 3*opsLimit {
		t.Errorf("without limits: writes %.0f B/s, reads %.1f/s; want at least 3x the limits, or the measurement shows nothing", free.write, free.read)
	}
	m.Stop()
}

// TestIOLimitsThroughTheProxies takes a StorageClass's I/O limit to a microVM guest the way an unmodified
// driver gets it there: the reference driver run as most drivers behave (no volume context, no raw block
// publish of a filesystem volume) behind crust-csi-proxy on both sides, driven by the CO simulator. A class
// whose limits crustd would refuse fails CreateVolume with INVALID_ARGUMENT naming the parameter, and the
// driver makes nothing. A class with crust.dev/total-iops: "50" gives a PersistentVolume whose attributes
// carry it, a descriptor whose io_limits say it, and a guest (a blank volume, formatted there) whose
// direct 4 KiB reads of the volume run at about 50 a second.
func TestIOLimitsThroughTheProxies(t *testing.T) {
	const opsLimit, reads = 50, 100
	d, assets := newMicroVMDaemon(t)
	logDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	vg := lvmtest.New(t, 512<<20)
	driverSock := filepath.Join(d.kubelet, "plugins", plainDriver, "driver.sock")
	startLVMDriver(t, driverSock, lvmdriver.Config{Name: plainDriver, VG: vg.Name, Devices: []string{vg.Device},
		StateDir: t.TempDir(), NoVolumeContext: true, StrictAccessType: true}, filepath.Join(logDir, "driver.log"))
	api, kubeconfig := startAPIServer(t)
	nodeSock := filepath.Join(d.kubelet, "plugins", plainDriver, "csi.sock")
	ctrlSock := filepath.Join(d.kubelet, "plugins", plainDriver, "controller.sock")
	startProxy(t, filepath.Join(logDir, "proxy.log"), "--csi-address", nodeSock, "--driver-address", driverSock,
		"--crust-socket", d.socket, "--microvm-handlers", microVMHandler, "--kubeconfig", kubeconfig,
		"--node-name", "node-1", "--state-dir", filepath.Join(d.kubelet, "plugins", "crust.dev", "csi-proxy"))
	startProxy(t, filepath.Join(logDir, "controller-proxy.log"), "--controller", "--csi-address", ctrlSock, "--driver-address", driverSock)
	vmState := t.TempDir()
	c := newCO(t, d, api, assets, vmState)
	drv, err := c.RegisterDriver(ctx, co.DriverConfig{NodeEndpoint: nodeSock, ControllerEndpoint: ctrlSock, PodInfoOnMount: true,
		ExtraCreateMetadata: true})
	if err != nil {
		t.Fatal(err)
	}

	_, err = c.Provision(ctx, co.StorageClass{Driver: drv, Parameters: map[string]string{volume.DeferKey: "true",
		volume.TotalIOPSKey: "50", volume.ReadIOPSKey: "5"}}, co.Claim{Namespace: "shop", Name: "bad", Size: 64 << 20})
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), volume.ReadIOPSKey) {
		t.Fatalf("provisioning with total and read IOPS: %v, want INVALID_ARGUMENT naming %s", err, volume.ReadIOPSKey)
	}
	if lvs, err := vg.LVs(); err != nil || len(lvs) != 0 {
		t.Fatalf("the driver made %v (%v) for a refused class", lvs, err)
	}

	vol, err := c.Provision(ctx, co.StorageClass{Driver: drv, Parameters: map[string]string{volume.DeferKey: "true",
		co.FSTypeKey: "ext4", volume.TotalIOPSKey: strconv.Itoa(opsLimit)}}, co.Claim{Namespace: "shop", Name: "data", Size: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := vol.Attributes[volume.TotalIOPSKey]; got != strconv.Itoa(opsLimit) {
		t.Fatalf("the PersistentVolume's attributes %v lack %s", vol.Attributes, volume.TotalIOPSKey)
	}
	rp, err := c.RunPod(ctx, &co.Pod{Namespace: "shop", Name: "db-0", RuntimeClassName: microVMClass,
		Volumes: []co.PodVolume{{Volume: vol, MountPath: "/data"}}})
	stopOnCleanup(t, c, rp)
	if err != nil {
		t.Fatal(err)
	}
	if got := getVolume(t, d, rp.TargetPath(vol)).GetSpec().GetIoLimits(); !proto.Equal(got, &crustv1.IOLimits{TotalIops: opsLimit}) {
		t.Fatalf("descriptor io_limits %v, want total_iops %d", got, opsLimit)
	}
	vm := rp.Sandbox.(*co.MicroVMSandbox)
	out, errOut, code, err := vm.Exec(ctx, "sh", "-c", fmt.Sprintf("dev=$(awk '$2 == \"/data\" {print $1}' /proc/mounts); "+
		"a=$(cut -d' ' -f1 /proc/uptime); dd if=$dev of=/dev/null bs=4k count=%d iflag=direct 2>/dev/null || exit 1; "+
		"b=$(cut -d' ' -f1 /proc/uptime); echo $a $b", reads))
	f := strings.Fields(out)
	if err != nil || code != 0 || len(f) != 2 {
		t.Fatalf("guest: exit %d, %v: %s%s", code, err, out, errOut)
	}
	a, _ := strconv.ParseFloat(f[0], 64)
	b, _ := strconv.ParseFloat(f[1], 64)
	rate := reads / max(b-a, 0.01)
	readTime := float64(reads) / opsLimit
	maxRate := (opsLimit*readTime + opsLimit/10 + 1) / readTime * 1.05
	t.Logf("StorageClass total-iops %d -> PV attributes -> descriptor -> QEMU: %d direct 4 KiB reads in the guest at %.1f/s", opsLimit, reads, rate)
	if rate > maxRate || rate < opsLimit/2 {
		t.Errorf("reads ran at %.1f/s, want at most %.1f and at least half of %d", rate, maxRate, opsLimit)
	}
	if err := c.StopPod(ctx, rp); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}
}
