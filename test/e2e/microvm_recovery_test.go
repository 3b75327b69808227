package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"crust.dev/crust/runtimehooks/microvm/handler"
	"crust.dev/crust/test/harness"
)

// TestMicroVMQemuKilled kills QEMU (SIGKILL) under a running crust-microvm whose volume is mounted in the
// guest. The handler, QEMU's parent, notices at once: it says in a log line and in its exit status
// (handler.ExitVMDied) that it released the claims and did not restart the VM, releases the claim in
// crustd, and leaves no socket and no process behind. One VM boot (TCG).
func TestMicroVMQemuKilled(t *testing.T) {
	assets := harness.GuestAssets(t, binDir)
	d := newDaemon(t)
	stateDir := t.TempDir()
	const name = "e2e-qemu-killed"
	target := d.podTarget("7a0c9e0a-0000-4000-8000-00000000e2e7", "pvc-q")
	dev := loopDevice(t, 64<<20)
	if _, errOut, code := d.crustctl("stage", "--target-path", target, "--device", dev, "--fs-type", "ext4", "--create-filesystem"); code != 0 {
		t.Fatalf("stage: exit %d: %s", code, errOut)
	}
	m := startMicroVM(t, d, assets, stateDir, name, target+":/data")
	if err := <-m.WaitMountedAsync("/data"); err != nil {
		t.Fatal(err)
	}
	if c := getVolume(t, d, target).GetClaim(); c.GetSandboxId() != name {
		t.Fatalf("claim %v, want sandbox %s", c, name)
	}

	qemu := m.QemuPid()
	t0 := time.Now()
	if err := syscall.Kill(qemu, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Exited():
	case <-time.After(time.Minute):
		t.Fatalf("crust-microvm still runs a minute after its QEMU was killed:\n%s", m.Log())
	}
	t.Logf("QEMU killed -> crust-microvm released the claim and exited in %s", time.Since(t0).Round(time.Millisecond))
	if code := m.ExitCode(); code != handler.ExitVMDied {
		t.Errorf("exit status %d, want %d (the VM died)", code, handler.ExitVMDied)
	}
	if got := m.LogValue("QEMU exited under the running sandbox; releasing the volumes' claims and stopping, not restarting the VM", "qemu"); got != "signal: killed" {
		t.Errorf("no log line saying what was done (qemu=%q):\n%s", got, m.Log())
	}
	if !strings.Contains(m.Log(), "the volumes' claims were released and the VM was not restarted") {
		t.Errorf("the exit message does not say what was done:\n%s", m.Log())
	}
	if c := getVolume(t, d, target).GetClaim(); c != nil {
		t.Errorf("still claimed after the handler stopped: %v", c)
	}
	if socks, _ := filepath.Glob(filepath.Join(stateDir, name, "*.sock")); len(socks) > 0 {
		t.Errorf("sockets left: %v", socks)
	}
	if pid := m.QemuPidWas; harness.ProcessAlive(pid) {
		t.Errorf("QEMU (pid %d) still running", pid)
	}
}
