package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
	"crust.dev/crust/internal/testutil/harness"
	"crust.dev/crust/test/co"
)

const (
	mib = int64(1) << 20
	// deferringDriver is the reference LVM driver with deferral on (flow 1): it deposits descriptors itself.
	deferringDriver = "defer.lvm.test.crust.dev"
	// plainDriver is the same driver with deferral off, unmodified behind crust-csi-proxy (flow 2).
	plainDriver = "lvm.test.crust.dev"
	// microVMClass is the RuntimeClass whose handler is crust-microvm.
	microVMClass   = "kata-crust"
	microVMHandler = "crust-microvm"
)

// TestCSIFlows drives both of crust's CSI flows through the CO simulator (test/co) to a real microVM
// guest, with one VM boot for both: a microVM pod uses a volume of the reference LVM driver deferring
// itself (flow 1, ext4) and a volume of the same driver with deferral off behind crust-csi-proxy (flow 2,
// xfs; the proxy decides by the pod's RuntimeClass, read from the simulator's API server).
//
// For each volume, in kubelet's order: CreateVolume, NodeStageVolume (nothing on the host),
// NodePublishVolume (a descriptor at crustd, an empty target directory on the host), the VM mounts it
// (formatted in the guest, fsGroup applied), data written in the guest, NodeGetVolumeStats reporting
// the guest's statfs, ControllerExpandVolume and NodeExpandVolume growing the filesystem online in the
// guest (same mount, data intact), the VM stopped, NodeUnpublishVolume, NodeUnstageVolume. Then the flow-2
// volume is published for a runc pod (no RuntimeClass): the proxy mounts it on the host, where the data
// written in the guest is intact and stats are the host's. Last, DeleteVolume of both, and nothing of
// either is left on the host: no mount, no loop device of a logical volume, no descriptor, no Kata
// directory, no kubelet or proxy directory or record, no logical volume.
func TestCSIFlows(t *testing.T) {
	t0 := time.Now()
	d, assets := newMicroVMDaemon(t)
	logDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	step := func(format string, args ...any) {
		t.Helper()
		t.Logf("[%6.2fs] %s", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}

	// Flow 1's driver: deferral on, one socket for kubelet and the controller sidecars.
	vgA := lvmtest.New(t, 1<<30)
	stateA := t.TempDir()
	sockA := filepath.Join(d.kubelet, "plugins", deferringDriver, "csi.sock")
	startLVMDriver(t, sockA, lvmdriver.Config{Name: deferringDriver, VG: vgA.Name, Devices: []string{vgA.Device},
		StateDir: stateA, CrustSocket: d.socket}, filepath.Join(logDir, "driver-a.log"))

	// Flow 2's driver: deferral off; kubelet reaches it through crust-csi-proxy, the sidecars directly.
	vgB := lvmtest.New(t, 1<<30)
	stateB := t.TempDir()
	sockB := filepath.Join(d.kubelet, "plugins", plainDriver, "driver.sock")
	startLVMDriver(t, sockB, lvmdriver.Config{Name: plainDriver, VG: vgB.Name, Devices: []string{vgB.Device},
		StateDir: stateB}, filepath.Join(logDir, "driver-b.log"))
	api, kubeconfig := startAPIServer(t)
	proxySock := filepath.Join(d.kubelet, "plugins", plainDriver, "csi.sock")
	proxyState := filepath.Join(d.kubelet, "plugins", "crust.dev", "csi-proxy")
	proxy := startProxy(t, filepath.Join(logDir, "proxy.log"), "--csi-address", proxySock, "--driver-address", sockB,
		"--crust-socket", d.socket, "--microvm-handlers", microVMHandler, "--kubeconfig", kubeconfig,
		"--node-name", "node-1", "--state-dir", proxyState)

	vmState := t.TempDir()
	c := newCO(t, d, api, assets, vmState)
	drvA, err := c.RegisterDriver(ctx, co.DriverConfig{NodeEndpoint: sockA, PodInfoOnMount: true, ExtraCreateMetadata: true})
	if err != nil {
		t.Fatal(err)
	}
	drvB, err := c.RegisterDriver(ctx, co.DriverConfig{NodeEndpoint: proxySock, ControllerEndpoint: sockB, PodInfoOnMount: true,
		ExtraCreateMetadata: true})
	if err != nil {
		t.Fatalf("%v\nproxy log:\n%s", err, proxy.log())
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"driver-a.log", "driver-b.log", "proxy.log"} {
				b, _ := os.ReadFile(filepath.Join(logDir, f))
				t.Logf("%s:\n%s", f, b)
			}
		}
	})
	step("crustd, two LVM drivers, crust-csi-proxy and the API server up; both drivers registered")

	// Provisioning: one StorageClass per driver, both asking for deferral.
	volA, err := c.Provision(ctx, co.StorageClass{Driver: drvA, Parameters: map[string]string{volume.DeferKey: "true", co.FSTypeKey: "ext4"}},
		co.Claim{Namespace: "shop", Name: "data-a", Size: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	volB, err := c.Provision(ctx, co.StorageClass{Driver: drvB, Parameters: map[string]string{volume.DeferKey: "true", co.FSTypeKey: "xfs"},
		MountOptions: []string{"noatime"}}, co.Claim{Namespace: "shop", Name: "data-b", Size: 320 * mib})
	if err != nil {
		t.Fatal(err)
	}
	step("provisioned %s (%d MiB, flow 1) and %s (%d MiB, flow 2)", volA.Name, volA.Capacity/mib, volB.Name, volB.Capacity/mib)

	// The microVM pod: both volumes staged and published, then the VM boots and mounts them.
	fsGroup := int64(2000)
	vmPod := &co.Pod{Namespace: "shop", Name: "db-0", ServiceAccount: "db", RuntimeClassName: microVMClass, FSGroup: &fsGroup,
		Volumes: []co.PodVolume{{Volume: volA, MountPath: "/data/a"}, {Volume: volB, MountPath: "/data/b"}}}
	rp, err := c.RunPod(ctx, vmPod)
	stopOnCleanup(t, c, rp)
	if err != nil {
		t.Fatal(err)
	}
	vm := rp.Sandbox.(*co.MicroVMSandbox)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("crust-microvm log:\n%s\nguest console:\n%s", vm.Log(), vm.Console())
		}
	})
	step("microVM pod running: VM answered after %s, both volumes mounted in the guest after %s",
		vm.Ready.Round(time.Millisecond), vm.Mounted.Round(time.Millisecond))

	// On the host: nothing mounted for either volume, a descriptor at crustd claimed by the VM, Kata's file.
	for _, v := range []*co.Volume{volA, volB} {
		target := rp.TargetPath(v)
		if m := mountsUnder(t, filepath.Dir(c.StagingPath(v))); len(m) > 0 {
			t.Errorf("%s: staged on the host: %v", v.Name, m)
		}
		// The proxy (flow 2) guards its deferred target with an empty read-only tmpfs: that, and nothing else.
		want := []string{}
		if v == volB {
			want = []string{target + " tmpfs crust-deferred"}
		}
		if m := mountsUnder(t, target); !slices.Equal(m, want) {
			t.Errorf("%s: mounted on the host at %v, want %v", v.Name, m, want)
		}
		if ents, err := os.ReadDir(target); err != nil || len(ents) > 0 {
			t.Errorf("%s: the target path is not an empty directory (%v, %d entries)", v.Name, err, len(ents))
		}
		got := getVolume(t, d, target)
		s := got.GetSpec()
		wantFS := map[*co.Volume]string{volA: "ext4", volB: "xfs"}[v]
		if s.GetFsType() != wantFS || !s.GetCreateFilesystem() || s.GetVolumeSupplementalGroup() != fsGroup || s.GetPodUid() != vmPod.UID ||
			s.GetCsiDriver() != v.Driver.Name || s.GetVolumeId() != v.Handle || !strings.HasPrefix(got.GetResolvedBackingPath(), "/dev/loop") {
			t.Errorf("%s: descriptor %v", v.Name, got)
		}
		if got.GetClaim().GetSandboxId() != vm.Name {
			t.Errorf("%s: claimed by %v, want sandbox %s", v.Name, got.GetClaim(), vm.Name)
		}
	}
	if slices.Contains(volB.MountOptions, "noatime") && !slices.Contains(getVolume(t, d, rp.TargetPath(volB)).GetSpec().GetMountFlags(), "noatime") {
		t.Error("flow 2: the StorageClass's mount option did not reach the descriptor")
	}
	for _, dir := range []string{stateA, stateB} { // what the check at the end must find gone
		if loops := loopsBackedUnder(t, dir); len(loops) != 1 {
			t.Errorf("loop devices of logical volumes under %s while the pod runs: %v, want one", dir, loops)
		}
	}
	if n := len(kataVolumes(t, d.kata)); n != 2 {
		t.Errorf("%d Kata volume directories, want 2", n)
	}
	if got := proxy.logValue("publish decision", "decision", rp.TargetPath(volB)); got != "defer" {
		t.Errorf("proxy decision for the microVM pod: %q, want defer", got)
	}

	// In the guest: formatted there, fsGroup applied, data written.
	guest := func(script string) string {
		t.Helper()
		out, errOut, code, err := vm.Exec(ctx, "sh", "-c", script)
		if err != nil || code != 0 {
			t.Fatalf("guest: %s: exit %d, %v: %s%s", script, code, err, out, errOut)
		}
		return strings.TrimSpace(out)
	}
	sums := map[*co.Volume]string{}
	for _, v := range []*co.Volume{volA, volB} {
		dir := map[*co.Volume]string{volA: "/data/a", volB: "/data/b"}[v]
		if got := guest("stat -c '%g %a' " + dir); got != "2000 2775" {
			t.Errorf("%s: the guest's root is %q, want gid 2000 and mode 2775 (fsGroup)", dir, got)
		}
		if got := harness.WaitLogFileValue(filepath.Join(vmState, vm.Name+".log"), "volume mounted", "formatted", "target="+rp.TargetPath(v)); got != "true" {
			t.Errorf("%s: the blank volume was not formatted in the guest (formatted=%q)", v.Name, got)
		}
		f := strings.Fields(guest(fmt.Sprintf("dd if=/dev/urandom of=%[1]s/data bs=1M count=8 2>/dev/null && sync && md5sum %[1]s/data", dir)))
		sums[v] = f[0]
	}
	step("data written in the guest on both volumes")

	// Stats through the driver (flow 1) and through the proxy (flow 2) are the guest's statfs.
	for _, v := range []*co.Volume{volA, volB} {
		dir := map[*co.Volume]string{volA: "/data/a", volB: "/data/b"}[v]
		st, err := c.VolumeStats(ctx, rp, v)
		if err != nil {
			t.Fatalf("%s: NodeGetVolumeStats: %v", v.Name, err)
		}
		g, block := guestStatfs(t, guest, dir)
		if u := csiUsage(st); !near(u.total, g.total, block) || !near(u.used, g.used, block) || !near(u.available, g.available, block) ||
			u.inodes != g.inodes || u.inodesUsed != g.inodesUsed || u.used < 8*mib {
			t.Errorf("%s: NodeGetVolumeStats %+v, the guest's statfs %+v", v.Name, u, g)
		} else {
			step("%s: NodeGetVolumeStats = the guest's statfs: %d of %d MiB used, %d inodes used", v.Name, u.used/mib, u.total/mib, u.inodesUsed)
		}
	}

	// Online expansion N -> 2N: ControllerExpandVolume, then NodeExpandVolume on the pod's target path.
	for _, v := range []*co.Volume{volA, volB} {
		dir := map[*co.Volume]string{volA: "/data/a", volB: "/data/b"}[v]
		mountID := guest(fmt.Sprintf("awk '$5 == %q {print $1}' /proc/self/mountinfo", dir))
		before := v.Capacity
		fsBefore, _ := guestStatfs(t, guest, dir)
		t1 := time.Now()
		res, err := c.Expand(ctx, v, 2*before)
		if err != nil {
			t.Fatalf("%s: expand: %v", v.Name, err)
		}
		took := time.Since(t1)
		if !res.NodeExpanded || res.Capacity != 2*before {
			t.Errorf("%s: expansion %+v, want the controller at %d and the node expanded", v.Name, res, 2*before)
		}
		if got := guest(fmt.Sprintf("blockdev --getsize64 $(awk '$2 == %q {print $1}' /proc/mounts)", dir)); got != strconv.FormatInt(2*before, 10) {
			t.Errorf("%s: the guest's disk has %s bytes, want %d", v.Name, got, 2*before)
		}
		g, block := guestStatfs(t, guest, dir)
		// The filesystem's own overhead (ext4's inode tables, xfs's log) stays out of statfs; growing the
		// device from N to 2N at least doubles what is left, less a little.
		if g.total < 2*fsBefore.total-before/20 || g.total > 2*before {
			t.Errorf("%s: the guest's filesystem has %d bytes after growing the volume %d -> %d (it had %d)", v.Name, g.total, before, 2*before, fsBefore.total)
		}
		if !near(res.NodeCapacity, g.total, block) { // crust answers with the grown filesystem's size
			t.Errorf("%s: NodeExpandVolume answered %d, the guest's filesystem has %d", v.Name, res.NodeCapacity, g.total)
		}
		if id := guest(fmt.Sprintf("awk '$5 == %q {print $1}' /proc/self/mountinfo", dir)); id != mountID {
			t.Errorf("%s: mount id %s before, %s after: remounted", v.Name, mountID, id)
		}
		if sum := strings.Fields(guest("md5sum " + dir + "/data"))[0]; sum != sums[v] {
			t.Errorf("%s: data changed across the expansion", v.Name)
		}
		st, err := c.VolumeStats(ctx, rp, v)
		if err != nil {
			t.Fatal(err)
		}
		if u := csiUsage(st); !near(u.total, g.total, block) {
			t.Errorf("%s: NodeGetVolumeStats total %d after expansion, the guest's %d", v.Name, u.total, g.total)
		}
		step("%s: grown online %d -> %d MiB (CSI, end to end: %s); the guest's filesystem now %d MiB, same mount, data intact",
			v.Name, before/mib, 2*before/mib, took.Round(time.Millisecond), g.total/mib)
	}

	// Stop the pod: VM down, unpublish, unstage; crustd and Kata forget both volumes.
	qemu := vm.QEMUPid()
	if err := c.StopPod(ctx, rp); err != nil {
		t.Fatal(err)
	}
	if harness.ProcessAlive(qemu) {
		t.Errorf("QEMU (pid %d) still runs after the pod stopped", qemu)
	}
	if n := len(listVolumes(t, d)); n != 0 {
		t.Errorf("crustd still holds %d descriptors after the microVM pod stopped", n)
	}
	if ents := kataVolumes(t, d.kata); len(ents) != 0 {
		t.Errorf("Kata volume directories left: %v", ents)
	}
	step("microVM pod stopped: VM down, both volumes unpublished and unstaged")

	// Flow 2, the same volume for a runc pod: the proxy mounts it on the host.
	runcPod := &co.Pod{Namespace: "shop", Name: "backup-0", Volumes: []co.PodVolume{{Volume: volB, MountPath: "/data/b"}}}
	rp2, err := c.RunPod(ctx, runcPod)
	stopOnCleanup(t, c, rp2)
	if err != nil {
		t.Fatal(err)
	}
	hs := rp2.Sandbox.(*co.HostSandbox)
	if got := proxy.logValue("publish decision", "decision", rp2.TargetPath(volB)); got != "host-mount" {
		t.Errorf("proxy decision for the runc pod: %q, want host-mount", got)
	}
	if hs.Mounts[0].FSType != "xfs" {
		t.Errorf("the runc pod's volume is %s on the host, want the xfs made in the guest", hs.Mounts[0].FSType)
	}
	out, err := exec.Command("md5sum", hs.Path("/data/b/data")).Output()
	if err != nil || strings.Fields(string(out))[0] != sums[volB] {
		t.Errorf("the data written in the guest, read on the host: %s, %v (the guest wrote %s)", out, err, sums[volB])
	}
	var hst unix.Statfs_t
	if err := unix.Statfs(rp2.TargetPath(volB), &hst); err != nil {
		t.Fatal(err)
	}
	st, err := c.VolumeStats(ctx, rp2, volB)
	if err != nil {
		t.Fatal(err)
	}
	if u := csiUsage(st); u.total != int64(hst.Blocks)*hst.Bsize || u.total < 2*320*mib-64*mib {
		t.Errorf("runc pod: NodeGetVolumeStats total %d, the host's statfs %d", u.total, int64(hst.Blocks)*hst.Bsize)
	}
	if n := len(listVolumes(t, d)); n != 0 {
		t.Errorf("crustd holds %d descriptors for a runc pod", n)
	}
	if err := c.StopPod(ctx, rp2); err != nil {
		t.Fatal(err)
	}
	step("runc pod: the proxy mounted %s on the host (xfs, %d MiB), the guest's data intact; pod stopped", volB.Name, int64(hst.Blocks)*hst.Bsize/mib)

	for _, v := range []*co.Volume{volA, volB} {
		if err := c.Delete(ctx, v); err != nil {
			t.Fatal(err)
		}
	}

	// kubelet's order, per driver (capability and registration calls left out).
	want := []string{"CreateVolume", "NodeStageVolume", "NodePublishVolume", "NodeGetVolumeStats", "ControllerExpandVolume",
		"NodeExpandVolume", "NodeGetVolumeStats", "NodeUnpublishVolume", "NodeUnstageVolume"}
	checkOrder(t, c.Calls(), deferringDriver, append(slices.Clone(want), "DeleteVolume"))
	checkOrder(t, c.Calls(), plainDriver, append(slices.Clone(want), "NodeStageVolume", "NodePublishVolume", "NodeGetVolumeStats",
		"NodeUnpublishVolume", "NodeUnstageVolume", "DeleteVolume"))
	for _, call := range c.Calls() {
		if call.Method == "ControllerPublishVolume" {
			t.Errorf("ControllerPublishVolume called, but neither driver advertises it")
		}
		if r, ok := call.Request.(*csi.NodePublishVolumeRequest); ok && call.Err == nil {
			vc := r.GetVolumeContext()
			if vc[volume.PodNameKey] == "" || vc[volume.PodUIDKey] == "" || vc[volume.EphemeralKey] != "false" || vc[co.ProvisionerIdentityKey] == "" {
				t.Errorf("NodePublishVolume without kubelet's volume context: %v", vc)
			}
		}
	}

	// Nothing left on the host.
	if m := mountsUnder(t, d.kubelet); len(m) > 0 {
		t.Errorf("mounts left under the kubelet dir: %v", m)
	}
	for _, dir := range []string{stateA, stateB} {
		if loops := loopsBackedUnder(t, dir); len(loops) > 0 {
			t.Errorf("loop devices of logical volumes left: %v", loops)
		}
	}
	if n := len(listVolumes(t, d)); n != 0 {
		t.Errorf("crustd holds %d descriptors at the end", n)
	}
	if ents := kataVolumes(t, d.kata); len(ents) != 0 {
		t.Errorf("Kata volume directories left: %v", ents)
	}
	for _, dir := range []string{filepath.Join(d.kubelet, "pods"), filepath.Join(d.kubelet, "plugins", "kubernetes.io", "csi", deferringDriver),
		filepath.Join(d.kubelet, "plugins", "kubernetes.io", "csi", plainDriver), filepath.Join(proxyState, "records"), filepath.Join(proxyState, "block")} {
		if ents := readDir(t, dir); len(ents) != 0 {
			t.Errorf("left in %s: %v", dir, ents)
		}
	}
	for _, vg := range []*lvmtest.VG{vgA, vgB} {
		if lvs, err := vg.LVs(); err != nil || len(lvs) != 0 {
			t.Errorf("logical volumes left in %s: %v %v", vg.Name, lvs, err)
		}
	}
	step("both volumes deleted; nothing left on the host")
}

// newCO is the CO simulator on node-1 with d's kubelet dir and api: pods of the RuntimeClass microVMClass
// run in crust-microvm (TCG, state in vmState), others on the host.
func newCO(t *testing.T, d *daemon, api *co.APIServer, assets, vmState string) *co.CO {
	t.Helper()
	c, err := co.New(co.Config{
		NodeName: "node-1", KubeletDir: d.kubelet, API: api,
		RuntimeClasses: map[string]string{microVMClass: microVMHandler},
		Runtimes: map[string]co.Runtime{
			microVMHandler: &co.MicroVM{Binary: filepath.Join(binDir, "crust-microvm"), CrustSocket: d.socket,
				StateDir: vmState, Assets: assets, Accel: "tcg"},
			co.DefaultHandler: co.Host{},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startLVMDriver runs the reference LVM driver in this process on socket, logging to logFile, until
// the test ends.
func startLVMDriver(t *testing.T, socket string, cfg lvmdriver.Config, logFile string) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	stop, err := lvmdriver.Start(socket, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop the %s driver: %v", cfg.Name, err)
		}
		_ = f.Close()
	})
}

// proxyProc is a crust-csi-proxy process.
// startAPIServer starts the stand-in API server until the test ends; it returns it and a kubeconfig
// file that reaches it.
func startAPIServer(t *testing.T) (*co.APIServer, string) {
	t.Helper()
	api := co.NewAPIServer()
	t.Cleanup(api.Close)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	return api, kubeconfig
}

type proxyProc struct{ *harness.Proc }

// startProxy runs crust-csi-proxy with args until the test ends (SIGTERM, then it must exit 0), once it
// answers on its --csi-address.
func startProxy(t *testing.T, logFile string, args ...string) *proxyProc {
	t.Helper()
	sock := args[slices.Index(args, "--csi-address")+1]
	return &proxyProc{harness.StartProc(t, harness.ProcConfig{
		Bin: filepath.Join(binDir, "crust-csi-proxy"), Args: append(args, "--log-level", "debug"), LogFile: logFile,
		StopMustSucceed: true, Ready: harness.AnswersCSI(sock),
	})}
}

func (p *proxyProc) log() string { return p.Log() }

// logValue returns key's value on the last log line with message msg that mentions target.
func (p *proxyProc) logValue(msg, key, target string) string {
	return harness.LogValue(p.log(), msg, key, "target="+target)
}

// stopOnCleanup stops a pod the test left running (after a failure), so that its VM lets go of the
// devices before the drivers and volume groups are torn down.
func stopOnCleanup(t *testing.T, c *co.CO, rp *co.RunningPod) {
	t.Cleanup(func() {
		if rp == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = c.StopPod(ctx, rp) // a pod stopped already has nothing left to undo
	})
}

// mountsUnder returns the mounts at or below dir, each as its mount point, filesystem type and source.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Mountpoint+" "+m.FSType+" "+m.Source)
	}
	return out
}

// readDir lists dir; a missing dir is empty.
func readDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// kataVolumes lists the volume directories in a Kata direct-volumes dir (crustd's own dot-files, such
// as its temporary directory, are not volumes: Kata reads base64url names only).
func kataVolumes(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range readDir(t, dir) {
		if !strings.HasPrefix(n, ".") {
			out = append(out, n)
		}
	}
	return out
}

// guestStatfs measures a filesystem in the guest as the guest agent does, and returns its block size.
func guestStatfs(t *testing.T, guest func(string) string, dir string) (usage, int64) {
	t.Helper()
	f := strings.Fields(guest("stat -f -c '%S %b %f %a %c %d' " + dir))
	if len(f) != 6 {
		t.Fatalf("stat -f %s: %v", dir, f)
	}
	n := make([]int64, 6)
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("stat -f %s: %v", dir, f)
		}
		n[i] = v
	}
	bs := n[0]
	return usage{total: n[1] * bs, used: (n[1] - n[2]) * bs, available: n[3] * bs, inodes: n[4], inodesUsed: n[4] - n[5]}, bs
}

func csiUsage(r *csi.NodeGetVolumeStatsResponse) usage {
	return usageOf(r.GetUsage(), csi.VolumeUsage_BYTES, csi.VolumeUsage_INODES)
}

func listVolumes(t *testing.T, d *daemon) []*crustv1.Volume {
	t.Helper()
	out, errOut, code := d.crustctl("ls", "-o", "json")
	var list crustv1.ListVolumesResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("ls: exit %d: %s%s", code, out, errOut)
	}
	return list.GetVolumes()
}

// loopsBackedUnder returns the loop devices whose backing file lies under dir.
func loopsBackedUnder(t *testing.T, dir string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		t.Fatalf("losetup --list: %v", err)
	}
	var loops []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[1], dir+"/") {
			loops = append(loops, line)
		}
	}
	return loops
}

// checkOrder checks the volume calls one driver received (capability, identity and registration calls
// left out, and failures the simulator retried) against want.
func checkOrder(t *testing.T, calls []co.Call, driver string, want []string) {
	t.Helper()
	var got []string
	for _, c := range calls {
		switch c.Method {
		case "GetPluginInfo", "GetPluginCapabilities", "Probe", "NodeGetInfo", "NodeGetCapabilities", "ControllerGetCapabilities":
			continue
		}
		switch status.Code(c.Err) {
		case codes.Unavailable, codes.Aborted, codes.DeadlineExceeded: // retried
			continue
		}
		if c.Driver != driver {
			continue
		}
		got = append(got, c.Method)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s received\n  %v\nwant\n  %v", driver, got, want)
	}
}
