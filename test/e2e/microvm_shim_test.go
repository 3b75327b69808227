package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/ctrdtest"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMShim runs a container through a private containerd 1.6 (the machine's /usr/bin/containerd)
// with runtime io.containerd.crust-microvm.v1, the shim found on PATH, from a busybox image built here
// and imported with ctr: one VM boot (TCG).
//
// It checks: the container's process runs in the guest (its uname -r is not the host's) and its output
// reaches containerd's FIFOs; a bind mount whose source is a target staged in crustd is claimed for the
// container's sandbox (the container's id, as ctr makes no CRI sandbox), formatted and mounted in the
// guest, written and read back there, with nothing mounted on the host's target; a subPath of the volume
// made as kubelet makes it (a directory of the target bind-mounted under the pod's volume-subpaths) is
// bound from the guest's mount, its writes on the volume and none on the node; ctr task exec runs in
// the same container; the exit status reaches containerd (ctr run exits with it); and after the task is
// deleted no QEMU, no virtiofsd, no claim, no mount and no state directory is left, while the data is on
// the device.
func TestMicroVMShim(t *testing.T) {
	const podUID = "3c9e0f1a-0000-4000-8000-00000000e2e9"
	d, ctrd, target, dev := shimWithVolume(t, podUID, "pvc-shim")

	// The container writes to the volume, says so, and waits for the test's exec to let it exit 7.
	const id = "shim-e2e-1"
	script := `uname -r; echo "written in the guest" > /data/f && sync && echo ready; ` +
		`while [ ! -e /data/stop ]; do sleep 0.1; done; exit 7`
	run := exec.Command(ctrdtest.Ctr(), ctrd.args("run", "--rm", "--runtime", "io.containerd.crust-microvm.v1",
		"--mount", "type=bind,src="+target+",dst=/data,options=rbind:rw", "crust.dev/e2e/busybox:1", id, "sh", "-c", script)...)
	stdout, err := run.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var runErr bytes.Buffer
	run.Stderr = &runErr
	t0 := time.Now()
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		ran <- run.Wait()
	}()
	t.Cleanup(func() {
		if run.ProcessState == nil {
			_ = run.Process.Kill()
		}
	})
	line := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("ctr run ended before %s: %v\n%s\ncontainerd's log: %s", what, <-ran, runErr.String(), ctrd.logTail())
			}
			return l
		case <-time.After(5 * time.Minute):
			t.Fatalf("no %s from the container after 5 minutes\ncontainerd's log: %s", what, ctrd.logTail())
		}
		return ""
	}
	kernel := line("uname -r")
	if ready := line("ready"); ready != "ready" {
		t.Fatalf("the container said %q, want ready", ready)
	}
	t.Logf("ctr run -> the container's process ran in the guest and wrote the volume: %s", time.Since(t0).Round(time.Millisecond))
	var host unix.Utsname
	_ = unix.Uname(&host)
	if kernel == "" || kernel == unix.ByteSliceToString(host.Release[:]) {
		t.Errorf("the container's kernel is %q, the host's is %q: it did not run in the guest", kernel, unix.ByteSliceToString(host.Release[:]))
	}

	// The volume: claimed for the container's sandbox, mounted in the guest only.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := crustv1.NewVolumeServiceClient(d.conn()).GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if err != nil {
		t.Fatal(err)
	}
	if sb := v.GetVolume().GetClaim().GetSandboxId(); sb != id {
		t.Errorf("the volume is claimed by sandbox %q, want the container's id %q", sb, id)
	}
	if n := mountsAt(t, target); n > 0 {
		t.Errorf("%d mounts on the host's target %s; the volume must be mounted in the guest only", n, target)
	}

	// exec in the same container: it sees what the first process wrote, in the guest.
	t1 := time.Now()
	out := ctrd.ok(t, "task", "exec", "--exec-id", "e1", id, "sh", "-c", "cat /data/f; grep -c ' /data ' /proc/mounts; uname -r")
	t.Logf("ctr task exec: %s", time.Since(t1).Round(time.Millisecond))
	if want := "written in the guest\n1\n" + kernel + "\n"; out != want {
		t.Errorf("exec said %q, want %q", out, want)
	}
	qemuPids := ctrd.processesOf(t)
	if len(qemuPids) < 2 {
		t.Errorf("QEMU and virtiofsd of the sandbox: found pids %v", qemuPids)
	}

	// containerd's task metrics: the guest's measure of the running container.
	t3 := time.Now()
	var m taskMetrics
	harness.Eventually(t, time.Minute, "ctr task metrics to show the container's memory and CPU", func() bool {
		m = ctrd.metrics(t, id)
		return m.Memory.Usage.Usage > 0 && m.CPU.Usage.Total > 0
	})
	t.Logf("ctr task metrics: memory %d bytes, CPU %d ns (%s)", m.Memory.Usage.Usage, m.CPU.Usage.Total, time.Since(t3).Round(time.Millisecond))

	// A host block device in linux.devices (as CRI gives a raw block volume; ctr run --device) reaches a
	// second container of the sandbox as a disk of the VM: what the guest writes there is on the host's
	// device, and the disk leaves the VM when the container is deleted.
	t4 := time.Now()
	raw := loopDevice(t, 16*mib)
	const pattern = "crust raw block from the guest"
	ctrd.ok(t, "run", "--rm", "--runtime", "io.containerd.crust-microvm.v1", "--device", raw,
		"--annotation", "io.kubernetes.cri.sandbox-id="+id, "--annotation", "io.kubernetes.cri.container-type=container",
		"crust.dev/e2e/busybox:1", id+"-dev", "sh", "-c", "echo '"+pattern+"' | busybox dd of="+raw+" conv=fsync")
	t.Logf("ctr run --device (a second container of the sandbox, its disk plugged and unplugged): %s", time.Since(t4).Round(time.Millisecond))
	if got := strings.TrimRight(harness.Run(t, "dd", "if="+raw, "bs=512", "count=1", "iflag=direct", "status=none"), "\x00"); got != pattern+"\n" {
		t.Errorf("the host's %s holds %q, want what the guest wrote", raw, got)
	}
	if disks := ctrd.ok(t, "task", "exec", "--exec-id", "e3", id, "grep", "-c", " vd", "/proc/partitions"); disks != "1\n" {
		t.Errorf("the guest has %q virtio disks after the device's container was deleted, want the volume's alone", disks)
	}

	// kubelet's subPath of the volume, made as kubelet makes it: the directory <target>/sub on the node,
	// bind-mounted under the pod's volume-subpaths, is a third container's bind source. The shim binds
	// sub/ of the guest's mount of the volume (made there): what the container writes is on the volume,
	// and the node's directory stays empty.
	t5 := time.Now()
	hostSub := filepath.Join(target, "sub")
	subMount := filepath.Join(d.KubeletDir, "pods", podUID, "volume-subpaths", "data", "c", "0")
	for _, dir := range []string{hostSub, subMount} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(hostSub, subMount, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(subMount, unix.MNT_DETACH) })
	ctrd.ok(t, "run", "--rm", "--runtime", "io.containerd.crust-microvm.v1", "--mount", "type=bind,src="+subMount+",dst=/sub,options=rbind:rw",
		"--annotation", "io.kubernetes.cri.sandbox-id="+id, "--annotation", "io.kubernetes.cri.container-type=container",
		"crust.dev/e2e/busybox:1", id+"-sub", "sh", "-c", "echo 'written through the subPath' > /sub/g && sync")
	t.Logf("ctr run with kubelet's subPath mount of the volume (a third container of the sandbox): %s", time.Since(t5).Round(time.Millisecond))
	if out := ctrd.ok(t, "task", "exec", "--exec-id", "e4", id, "cat", "/data/sub/g"); out != "written through the subPath\n" {
		t.Errorf("the volume's sub/g, read in the first container: %q, want what the subPath's container wrote", out)
	}
	if left, err := os.ReadDir(hostSub); err != nil || len(left) > 0 {
		t.Errorf("the node's %s holds %v (%v): the subPath's container wrote to the node's disk", hostSub, left, err)
	}

	// The exit status reaches containerd; ctr run --rm then deletes the task and the container.
	t2 := time.Now()
	ctrd.ok(t, "task", "exec", "--exec-id", "e2", id, "touch", "/data/stop")
	select {
	case err := <-ran:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Errorf("ctr run ended with %v, want exit status 7\n%s", err, runErr.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("ctr run did not end after the container's exit\ncontainerd's log: %s", ctrd.logTail())
	}
	t.Logf("exit -> ctr run ended, the task and the sandbox deleted: %s", time.Since(t2).Round(time.Millisecond))
	for _, l := range strings.Split(ctrd.logTail(), "\n") {
		if strings.Contains(l, `msg="VM up"`) || strings.Contains(l, `msg="sandbox torn down"`) {
			t.Logf("the shim: %s", l)
		}
	}

	// Nothing is left: no QEMU, no virtiofsd, no claim, no mount, no state directory.
	harness.Eventually(t, time.Minute, "QEMU and virtiofsd to be gone", func() bool { return len(ctrd.processesOf(t)) == 0 })
	v, err = crustv1.NewVolumeServiceClient(d.conn()).GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	if err != nil || v.GetVolume().GetClaim() != nil {
		t.Errorf("after delete: volume %v, err %v; want no claim", v.GetVolume().GetClaim(), err)
	}
	if n := mountsAt(t, ctrd.stateDir) + mountsAt(t, target); n > 0 {
		t.Errorf("after delete: %d mounts left under %s or on the target", n, ctrd.stateDir)
	}
	if left, _ := os.ReadDir(ctrd.stateDir); len(left) > 0 {
		t.Errorf("after delete: the shim's state directory holds %v", left)
	}
	// The data is on the device, written by the guest.
	mnt := t.TempDir()
	harness.Run(t, "mount", "-o", "ro", dev, mnt)
	b, err := os.ReadFile(filepath.Join(mnt, "f"))
	g, gerr := os.ReadFile(filepath.Join(mnt, "sub", "g"))
	_ = unix.Unmount(mnt, 0)
	if err != nil || string(b) != "written in the guest\n" {
		t.Errorf("the device holds %q (%v), want what the guest wrote", b, err)
	}
	if gerr != nil || string(g) != "written through the subPath\n" {
		t.Errorf("the device's sub/g holds %q (%v), want what the subPath's container wrote", g, gerr)
	}
}

// TestMicroVMShimSIGTERM boots a sandbox with a crust volume through containerd (ctr run -d, one TCG
// boot), sends its shim SIGTERM and checks that the shim tore the sandbox down before it exited: once its
// process is gone, no QEMU or virtiofsd of it runs, crustd holds no claim for the volume and the state
// directory is gone.
func TestMicroVMShimSIGTERM(t *testing.T) {
	d, ctrd, target, _ := shimWithVolume(t, "3c9e0f1a-0000-4000-8000-00000000e2ea", "pvc-sigterm")

	const id = "shim-sigterm-1"
	t0 := time.Now()
	ctrd.ok(t, "run", "-d", "--runtime", "io.containerd.crust-microvm.v1", "--mount", "type=bind,src="+target+",dst=/data,options=rbind:rw",
		"crust.dev/e2e/busybox:1", id, "sleep", "1000")
	t.Logf("ctr run -d: %s", time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claim := func() *crustv1.Claim {
		t.Helper()
		v, err := crustv1.NewVolumeServiceClient(d.conn()).GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
		if err != nil {
			t.Fatal(err)
		}
		return v.GetVolume().GetClaim()
	}
	if c := claim(); c.GetSandboxId() != id {
		t.Fatalf("the volume's claim is %v, want sandbox %s's", c, id)
	}
	if n := len(ctrd.processesOf(t)); n < 2 {
		t.Fatalf("%d QEMU and virtiofsd processes of the sandbox, want 2", n)
	}
	out, err := exec.Command("pgrep", "-f", "containerd-shim-crust-microvm-v1 .*-id "+id).Output()
	pids := strings.Fields(string(out))
	if err != nil || len(pids) != 1 {
		t.Fatalf("pgrep for the sandbox's shim: %q, %v; want one pid", out, err)
	}
	var shim int
	if _, err := fmt.Sscan(pids[0], &shim); err != nil {
		t.Fatal(err)
	}

	t1 := time.Now()
	if err := unix.Kill(shim, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 3*time.Minute, "the shim to exit after SIGTERM", func() bool { return !harness.ProcessAlive(shim) })
	t.Logf("SIGTERM -> the shim exited: %s", time.Since(t1).Round(time.Millisecond))
	// Checked at once: what the shim left when it exited, before anyone (containerd's delete action, crustd's
	// handler grace) cleans up after it.
	if left := ctrd.processesOf(t); len(left) > 0 {
		t.Errorf("after the shim exited: QEMU or virtiofsd still run: %v", left)
	}
	if c := claim(); c != nil {
		t.Errorf("after the shim exited: the volume is still claimed: %v", c)
	}
	if left, _ := os.ReadDir(ctrd.stateDir); len(left) > 0 {
		t.Errorf("after the shim exited: the shim's state directory holds %v", left)
	}
	if n := mountsAt(t, ctrd.stateDir) + mountsAt(t, target); n > 0 {
		t.Errorf("after the shim exited: %d mounts left under %s or on the target", n, ctrd.stateDir)
	}
	// The shim's exit was an orderly one: the library's, after the publisher closed (its stderr is in
	// containerd's log).
	for _, l := range strings.Split(ctrd.logTail(), "\n") {
		if strings.Contains(l, `msg="sandbox torn down"`) {
			t.Logf("the shim: %s", l)
		}
		if strings.Contains(l, "publisher not closed") {
			t.Errorf("the shim exited on an error: %s", l)
		}
	}
}

// shimWithVolume starts crustd with a 64 MiB loop device staged (ext4, made at first mount) at the target
// of volume pvc of pod podUID, and a private containerd with the shim and the busybox image
// crust.dev/e2e/busybox:1. It skips without containerd (the machine's, or $CRUST_CONTAINERD_DIR's).
func shimWithVolume(t *testing.T, podUID, pvc string) (d *daemon, ctrd *containerd, target, dev string) {
	t.Helper()
	if _, err := os.Stat(ctrdtest.Bin()); err != nil {
		t.Skip("no " + ctrdtest.Bin() + " (Debian package containerd)")
	}
	d, assets := newMicroVMDaemon(t)
	target, dev = d.podTarget(podUID, pvc), loopDevice(t, 64*mib)
	d.crustctlOK("stage", "--target-path", target, "--device", dev, "--fs-type", "ext4", "--create-filesystem")
	ctrd = startContainerd(t, d.socket, d.KubeletDir, assets)
	ctrd.importImage(t, "crust.dev/e2e/busybox:1")
	return d, ctrd, target, dev
}

// The private containerd is ctrdtest's; these are the names the shim tests use.

// mountsAt counts the mounts at or below dir.
func mountsAt(t *testing.T, dir string) int { t.Helper(); return ctrdtest.MountsAt(t, dir) }

// containerd is a private containerd (ctrdtest.Containerd) with the shim built for this test binary.
type containerd struct {
	*ctrdtest.Containerd
	stateDir string
}

// startContainerd starts a private containerd with the shim on PATH, for crustd at crustSocket.
func startContainerd(t *testing.T, crustSocket, kubeletDir, assets string) *containerd {
	t.Helper()
	c := ctrdtest.Start(t, ctrdtest.Config{ShimDir: binDir, CrustSocket: crustSocket, KubeletDir: kubeletDir, Assets: assets})
	return &containerd{Containerd: c, stateDir: c.StateDir}
}

func (c *containerd) args(args ...string) []string { return c.Args(args...) }

// ok runs ctr with args and answers its stdout; a failure fails the test.
func (c *containerd) ok(t *testing.T, args ...string) string { t.Helper(); return c.OK(t, args...) }

func (c *containerd) logTail() string { return c.LogTail() }

// processesOf answers the pids of the shim's QEMU and virtiofsd.
func (c *containerd) processesOf(t *testing.T) []string { t.Helper(); return c.Processes() }

// importImage imports a busybox image as ref.
func (c *containerd) importImage(t *testing.T, ref string) { t.Helper(); c.ImportImage(t, ref) }

// taskMetrics is what the test reads of `ctr task metrics --format json` (cgroups v1's Metrics).
type taskMetrics struct {
	CPU struct {
		Usage struct{ Total uint64 }
	}
	Memory struct {
		Usage struct{ Usage uint64 }
	}
}

// metrics answers containerd's task metrics of container id.
func (c *containerd) metrics(t *testing.T, id string) taskMetrics {
	t.Helper()
	var m taskMetrics
	out := c.ok(t, "task", "metrics", "--format", "json", id)
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("ctr task metrics: %v\n%s", err, out)
	}
	return m
}
