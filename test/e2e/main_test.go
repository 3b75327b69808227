// Package e2e drives crust's real binaries: crustd on a real unix socket, crustctl as a separate process,
// real loop devices. It needs root; `make test` runs it as root.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/harness"
)

var binDir string

func TestMain(m *testing.M) {
	harness.RootMain(m, "e2e", "loop devices, mounts, other uids", run)
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "crust-e2e-bin")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := harness.Build(dir, "crust.dev/crust/cmd/...", "crust.dev/crust/examples/microvm/cmd/...",
		"crust.dev/crust/examples/lvm-csi/cmd/crust-lvm-csi"); err != nil {
		fmt.Println("e2e: build:", err)
		return 1
	}
	binDir = dir
	// The binaries must be reachable by a process of another uid (peer-credential tests).
	_ = os.Chmod(dir, 0o755)
	return m.Run()
}

// daemon is a crustd process on temp dirs (harness.Crustd), with the names the e2e tests use.
type daemon struct {
	*harness.Crustd
	t                                  *testing.T
	root, socket, state, kata, kubelet string
}

func newDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	c := harness.StartCrustd(t, filepath.Join(binDir, "crustd"), extra...)
	return &daemon{Crustd: c, t: t, root: c.Root, socket: c.Socket, state: c.StateDir, kata: c.KataDir, kubelet: c.KubeletDir}
}

// start starts crustd again (after Stop or Kill) and fails the test when it does not come up serving.
func (d *daemon) start() {
	d.t.Helper()
	if err := d.Start(); err != nil {
		d.t.Fatal(err)
	}
}

// serving waits at most timeout until crustd serves; an error when it does not or it exits.
func (d *daemon) serving(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return harness.WaitServing(ctx, d.socket, d.Exited())
}

func (d *daemon) conn() *grpc.ClientConn {
	d.t.Helper()
	c, err := crustd.Dial(d.socket)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = c.Close() })
	return c
}

// crustctl runs the CLI against d and returns stdout, stderr and the exit status.
func (d *daemon) crustctl(args ...string) (string, string, int) {
	d.t.Helper()
	return runAs(d.t, nil, filepath.Join(binDir, "crustctl"), append([]string{"--crust-socket", d.socket}, args...)...)
}

// crustctlOK runs the CLI against d and returns its stdout; a non-zero exit fails the test, with stderr.
func (d *daemon) crustctlOK(args ...string) string {
	d.t.Helper()
	out, errOut, code := d.crustctl(args...)
	if code != 0 {
		d.t.Fatalf("crustctl %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func runAs(t *testing.T, cred *syscall.Credential, bin string, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %s: %v", bin, strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), code
}

// loopDevice attaches a sparse file of size bytes to a free loop device and detaches it at cleanup.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	dev, _ := testutil.Loop(t, size)
	return dev
}

// podTarget returns a kubelet-shaped publish target path under d's kubelet dir, with the pod dir made.
func (d *daemon) podTarget(pod, pv string) string {
	d.t.Helper()
	return d.PodTarget(d.t, pod, pv)
}
