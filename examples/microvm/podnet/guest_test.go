//go:build linux

package podnet

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/harness"
)

// A guest given the pod's network owns the pod's address: it pings the peer from the pod's IP and the
// answer, addressed to the pod's IP, reaches the guest rather than the namespace's own stack (which holds
// the same address: without the redirection the ping would go unanswered in the guest).
func TestGuestOwnsPodAddress(t *testing.T) {
	pod, _ := podNamespaces(t)
	assets := harness.GuestAssets(t, t.TempDir())
	l, err := Connect(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := harness.Context(t, 3*time.Minute)
	defer cancel()
	machine, err := vm.Start(ctx, vm.Config{
		Kernel: filepath.Join(assets, "cloud", "vmlinux"), Initramfs: filepath.Join(assets, "initramfs-cloud.cpio"),
		StateDir: filepath.Join(t.TempDir(), "vm"), NICs: []vm.NIC{{Tap: l.Tap, MAC: l.Interface.MAC}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = machine.Stop(context.Background()) }()
	agent := machine.Agent()
	if _, err := agent.Health(ctx, &agentv1.HealthRequest{WaitStarted: true}); err != nil {
		t.Fatal(err)
	}
	run := func(argv ...string) string {
		t.Helper()
		r, err := agent.Exec(ctx, &agentv1.ExecRequest{Argv: argv, TimeoutMillis: 60_000})
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(argv, " "), err)
		}
		if r.GetExitStatus() != 0 {
			t.Fatalf("%s: exit %d: %s%s", strings.Join(argv, " "), r.GetExitStatus(), r.GetStdout(), r.GetStderr())
		}
		return string(r.GetStdout())
	}
	for _, cmd := range l.Interface.GuestCommands("eth0") {
		run(cmd...)
	}
	if out := run("ip", "addr", "show", "eth0"); !strings.Contains(out, "10.77.0.2/24") || !strings.Contains(out, l.Interface.MAC.String()) {
		t.Fatalf("the guest's eth0:\n%s", out)
	}
	out := run("ping", "-c", "1", "-W", "30", "10.77.0.1")
	if !strings.Contains(out, "1 packets received") {
		t.Fatalf("ping from the guest:\n%s", out)
	}
	t.Log(strings.TrimSpace(out))
}
