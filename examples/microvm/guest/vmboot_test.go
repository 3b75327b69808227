//go:build linux

package guest_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/initramfs"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/harness"
)

// bootWithShare boots a guest (TCG) with share as the virtio-fs share tagged crust-shared, from the guest
// assets in CRUST_GUEST_ASSETS or _output/guest; it skips without root, QEMU, virtiofsd or the assets.
func bootWithShare(t *testing.T, share string) (*vm.VM, initramfs.Assets) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the VM tests need root")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("skipping: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
	}
	if _, err := vm.FindVirtioFSD(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	src := os.Getenv("CRUST_GUEST_ASSETS")
	if src == "" {
		src = filepath.Join(harness.ModuleRoot(t), "_output", "guest")
	}
	assets, err := initramfs.LoadAssets(src, "cloud")
	if err != nil {
		t.Skipf("skipping: no guest assets (run hack/guest/fetch-kernel.sh): %v", err)
	}
	dir := harness.GuestAssets(t, t.TempDir()) // builds crust-guest and its initramfs from this tree
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := vm.Start(ctx, vm.Config{Kernel: filepath.Join(dir, "cloud", "vmlinux"),
		Initramfs: filepath.Join(dir, "initramfs-cloud.cpio"), StateDir: t.TempDir(),
		FSShares: []vm.FSShare{{Tag: "crust-shared", Path: share}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(v.ConsoleLog()); err == nil && t.Failed() {
			t.Logf("console:\n%s", b)
		}
		if err := v.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return v, assets
}

// tinyRootfs makes a rootfs of busybox (with the applets the test runs), /etc/passwd and /etc/group.
func tinyRootfs(t *testing.T, root, busybox string) {
	t.Helper()
	for _, d := range []string{"bin", "etc", "tmp", "data", "dev", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, data string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("bin/busybox", string(b), 0o755)
	for _, applet := range []string{"sh", "echo", "id", "pwd", "sleep", "cat", "tty", "touch", "grep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/tmp:/bin/sh\n", 0o644)
	write("etc/group", "root:x:0:\nuser:x:1000:\nextra:x:2000:user\n", 0o644)
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
}
