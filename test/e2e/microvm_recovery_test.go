package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/vmhandler"
	"crust.dev/crust/internal/testutil/harness"
)

// TestMicroVMQemuKilled first forces the release of a volume mounted in a running crust-microvm's guest:
// the handler, alive, claims it again and says so. Then it kills QEMU (SIGKILL) under it. The handler, QEMU's parent, notices at once: it says in a log line and in its exit status
// (vmhandler.ExitVMDied) that it released the claims and did not restart the VM, releases the claim in
// crustd, and leaves no socket and no process behind. One VM boot (TCG).
func TestMicroVMQemuKilled(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	stateDir := t.TempDir()
	const name = "e2e-qemu-killed"
	target := d.podTarget("7a0c9e0a-0000-4000-8000-00000000e2e7", "pvc-q")
	dev := loopDevice(t, 64<<20)
	d.crustctlOK("stage", "--target-path", target, "--device", dev, "--fs-type", "ext4", "--create-filesystem")
	m := startMicroVM(t, d, assets, stateDir, name, target+":/data")
	if err := <-m.WaitMountedAsync("/data"); err != nil {
		t.Fatal(err)
	}
	if c := getVolume(t, d, target).GetClaim(); c.GetSandboxId() != name {
		t.Fatalf("claim %v, want sandbox %s", c, name)
	}

	// An operator forces the release while the volume is mounted: the live handler claims it again.
	if _, errOut, code := d.crustctl("release", target, "--force"); code != 0 {
		t.Fatalf("release --force: exit %d: %s", code, errOut)
	}
	harness.Eventually(t, 10*time.Second, "crust-microvm to claim its mounted volume again", func() bool {
		return getVolume(t, d, target).GetClaim().GetSandboxId() == name
	})
	if got := m.WaitLogValue("crustd ended the claim of a volume mounted in the guest; claimed it again", "reason"); got != "RELEASE_REASON_FORCED" {
		t.Errorf("claimed again, logged with reason %q:\n%s", got, m.Log())
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
	if code := m.ExitCode(); code != vmhandler.ExitVMDied {
		t.Errorf("exit status %d, want %d (the VM died)", code, vmhandler.ExitVMDied)
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
