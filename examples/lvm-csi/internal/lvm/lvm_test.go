package lvm

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A Runner with a system directory runs LVM with asynchronous I/O off, which --config alone cannot do;
// against it, a system directory whose lvm.conf sets nothing gives LVM's built-in default, on (whatever
// the host's /etc/lvm says).
func TestUseSystemDir(t *testing.T) {
	if _, err := exec.LookPath("lvm"); err != nil {
		t.Skip("lvm2 is not installed (make deps)")
	}
	ctx := context.Background()
	r := &Runner{}
	if err := r.UseSystemDir(t.TempDir() + "/lvm"); err != nil {
		t.Fatal(err)
	}
	bare := &Runner{systemDir: t.TempDir()}
	if err := os.WriteFile(bare.systemDir+"/lvm.conf", []byte("global {\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    *Runner
		want string
	}{{r, "use_aio=0"}, {bare, "use_aio=1"}} {
		out, err := c.r.Run(ctx, "lvmconfig", "--type", "full", "global/use_aio")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Fatalf("lvmconfig global/use_aio, system directory %q: %q, want %q", c.r.systemDir, got, c.want)
		}
	}
	if err := r.UseSystemDir("/proc/no-such-dir/lvm"); err == nil {
		t.Fatal("UseSystemDir under /proc succeeded")
	}
}
