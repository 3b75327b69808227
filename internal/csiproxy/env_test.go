package csiproxy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/harness"
)

// env is a node for integration tests: a throw-away volume group, the reference LVM driver (deferral
// off: it is the unmodified driver behind the proxy) on its socket as a process of its own, crustd in this process, and a
// kubelet-shaped directory tree. It needs root.
type env struct {
	t                                testing.TB
	root, kubelet, state             string
	driverSock, crustSock, proxySock string
	driverName                       string
	driverConn                       *grpc.ClientConn
	ctrl                             csi.ControllerClient
	crust                            crustv1.VolumeServiceClient
	log                              *slog.Logger
}

func requireRoot(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t, "for LVM, loop devices and mounts")
}

// quietLog is where the components' logs go unless CSIPROXY_TEST_LOG=1.
func quietLog() *slog.Logger {
	if os.Getenv("CSIPROXY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newEnv(t testing.TB) *env {
	t.Helper()
	requireRoot(t)
	root, err := os.MkdirTemp("", "csiproxy")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, root: root, kubelet: filepath.Join(root, "kubelet"), state: filepath.Join(root, "proxy-state"),
		driverSock: filepath.Join(root, "driver.sock"), crustSock: filepath.Join(root, "crust.sock"),
		proxySock: filepath.Join(root, "csi.sock"), log: quietLog()}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	if err := os.MkdirAll(filepath.Join(e.kubelet, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	e.startDriver(1 << 30)
	e.startCrustd()
	if e.driverConn, err = crustd.Dial(e.driverSock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.driverConn.Close() })
	e.ctrl = csi.NewControllerClient(e.driverConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The driver is ready once it answers; WaitForReady waits on its socket, not on the clock.
	info, err := csi.NewIdentityClient(e.driverConn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	e.driverName = info.GetName()
	return e
}

// lvmConfig keeps LVM to the one loop device and away from udev and metadata backups, as the driver
// does.
func lvmConfig(dev string) string {
	return `devices { use_devicesfile=0 obtain_device_list_from_udev=0 external_device_info_source="none" ` +
		`scan_lvs=0 global_filter=["a|^` + dev + `$|","r|.*|"] } ` +
		`activation { udev_sync=0 udev_rules=0 verify_udev_operations=1 monitoring=0 } backup { backup=0 archive=0 }`
}

func lvmRun(dev string, args ...string) error {
	c := exec.Command("lvm", append([]string{args[0], "--config", lvmConfig(dev)}, args[1:]...)...)
	c.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1", "DM_DISABLE_UDEV=1")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("lvm %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

var driverBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// driverBinary builds the reference LVM driver once per test binary. It lives in its own Go module
// (examples/lvm-csi, with dependencies this module does not take), which the repository's go.work brings
// into reach.
func driverBinary(t testing.TB) string {
	t.Helper()
	driverBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "csiproxy-driver")
		if err != nil {
			driverBuild.err = err
			return
		}
		driverBuild.dir, driverBuild.bin = dir, filepath.Join(dir, "crust-lvm-csi")
		out, err := exec.Command("go", "build", "-o", driverBuild.bin,
			"crust.dev/crust/examples/lvm-csi/cmd/crust-lvm-csi").CombinedOutput()
		if err != nil {
			driverBuild.err = fmt.Errorf("build crust-lvm-csi: %v\n%s", err, out)
		}
	})
	if driverBuild.err != nil {
		t.Fatal(driverBuild.err)
	}
	return driverBuild.bin
}

// startDriver makes a volume group of size bytes on a loop device and runs the reference LVM driver on
// it, at e.driverSock, until the test ends; the volume group goes at cleanup with whatever it holds.
func (e *env) startDriver(size int64) {
	t := e.t
	t.Helper()
	bin := driverBinary(t)
	dev, _ := testutil.Loop(t, size)
	vg := "crust-" + strings.TrimPrefix(filepath.Base(e.root), "csiproxy")
	for _, args := range [][]string{{"pvcreate", "--yes", dev}, {"vgcreate", "--yes", vg, dev}} {
		if err := lvmRun(dev, args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, args := range [][]string{{"vgremove", "--yes", "--force", "--", vg}, {"pvremove", "--yes", dev}} {
			if err := lvmRun(dev, args...); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	cmd := exec.Command(bin, "--endpoint", e.driverSock, "--vg", vg, "--pv", dev,
		"--state-dir", filepath.Join(e.root, "driver"), "--log-level", "debug")
	if os.Getenv("CSIPROXY_TEST_LOG") != "" {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("stop driver: %v", err)
		}
	})
}

// startCrustd runs crustd in this process until the test ends.
func (e *env) startCrustd() {
	cfg := daemon.Defaults()
	cfg.Socket, cfg.StateDir, cfg.KataDir, cfg.KubeletDir = e.crustSock, filepath.Join(e.root, "crustd"), "", e.kubelet
	cfg.HTTPAddr, cfg.GCInterval = "", time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done, exited := make(chan error, 1), make(chan struct{})
	go func() { done <- daemon.Run(ctx, cfg, e.log); close(exited) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("crustd: %v", err)
		}
	})
	cc, err := crustd.Dial(e.crustSock)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	e.crust = crustv1.NewVolumeServiceClient(cc)
	wctx, wcancel := harness.Context(e.t, 10*time.Second)
	defer wcancel()
	if err := harness.WaitServing(wctx, e.crustSock, exited); err != nil {
		e.t.Fatalf("crustd did not come up: %v", err)
	}
}

func (e *env) config() Config {
	return Config{CSIAddress: e.proxySock, DriverAddress: e.driverSock, CrustSocket: e.crustSock, StateDir: e.state,
		PodWait: time.Second, LockWait: 5 * time.Second, GuardTargets: true}
}

// createVolume makes a volume through the driver's controller; deferrable volumes carry crust.dev/defer.
func (e *env) createVolume(name string, size int64, deferrable bool) *csi.Volume {
	e.t.Helper()
	params := map[string]string{}
	if deferrable {
		params[DeferKey] = "true"
	}
	return e.createVolumeWith(name, size, params)
}

// createVolumeWith makes a volume of a class of params through the driver's controller, deleted at the
// end of the test.
func (e *env) createVolumeWith(name string, size int64, params map[string]string) *csi.Volume {
	e.t.Helper()
	r, err := e.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()}, Parameters: params})
	if err != nil {
		e.t.Fatal(err)
	}
	v := r.GetVolume()
	e.t.Cleanup(func() {
		if _, err := e.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			e.t.Errorf("delete volume %s: %v", v.GetVolumeId(), err)
		}
	})
	return v
}

// target returns a kubelet-shaped publish target path, with its parent made (kubelet makes it).
func (e *env) target(podUID, pv string) string {
	e.t.Helper()
	dir := filepath.Join(e.kubelet, "pods", podUID, "volumes", "kubernetes.io~csi", pv)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		e.t.Fatal(err)
	}
	return filepath.Join(dir, "mount")
}

// staging returns a kubelet-shaped staging path, made (kubelet makes it).
func (e *env) staging(pv string) string {
	e.t.Helper()
	dir := filepath.Join(e.kubelet, "plugins", "kubernetes.io", "csi", e.driverName, pv, "globalmount")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		e.t.Fatal(err)
	}
	return dir
}

// mountsUnder lists the mount points at or under any of dirs, from this process's mountinfo.
func mountsUnder(dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(d))
		if err != nil {
			return []string{err.Error()}
		}
		for _, m := range ms {
			out = append(out, m.Mountpoint)
		}
	}
	return out
}

// assertClean fails unless nothing of the proxy's is left: no mount under the kubelet tree or the
// proxy's state, no descriptor in crustd, no record, no private path.
func (e *env) assertClean() {
	e.t.Helper()
	if m := mountsUnder(e.kubelet, e.state); len(m) > 0 {
		e.t.Errorf("mounts left: %v", m)
	}
	l, err := e.crust.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(l.GetVolumes()) > 0 {
		e.t.Errorf("descriptors left in crustd: %v", l.GetVolumes())
	}
	for _, d := range []string{"records", "block", "tmp"} {
		if names, _ := os.ReadDir(filepath.Join(e.state, d)); len(names) > 0 {
			e.t.Errorf("%s/ left: %v", d, names)
		}
	}
	left, _ := filepath.Glob(filepath.Join(e.kubelet, "pods", "*", "volumes", "kubernetes.io~csi", "*", privateBlockDir))
	if len(left) > 0 {
		e.t.Errorf("private paths left beside the targets: %v", left)
	}
}

// run runs a command and fails the test on error.
func sh(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}
