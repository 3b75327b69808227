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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/pkg/client"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipped, needs root (loop devices, mounts, other uids)")
		return 0
	}
	dir, err := os.MkdirTemp("", "crust-e2e-bin")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	build := exec.Command("go", "build", "-o", dir+"/", "crust.dev/crust/cmd/...", "crust.dev/crust/examples/microvm/cmd/...",
		"crust.dev/crust/examples/lvm-csi/cmd/crust-lvm-csi")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("e2e: build:", err)
		return 1
	}
	binDir = dir
	// The binaries must be reachable by a process of another uid (peer-credential tests).
	_ = os.Chmod(dir, 0o755)
	return m.Run()
}

// daemon is a crustd process on temp dirs.
type daemon struct {
	t       *testing.T
	root    string
	socket  string
	state   string
	kata    string
	kubelet string
	args    []string
	cmd     *exec.Cmd
	log     *bytes.Buffer
}

func newDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	root := t.TempDir()
	d := &daemon{
		t: t, root: root,
		socket:  filepath.Join(root, "run", "crust.sock"),
		state:   filepath.Join(root, "state"),
		kata:    filepath.Join(root, "kata"),
		kubelet: filepath.Join(root, "kubelet"),
	}
	if err := os.MkdirAll(filepath.Join(d.kubelet, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	d.args = append([]string{
		"--socket", d.socket, "--state-dir", d.state, "--kata-dir", d.kata, "--kubelet-dir", d.kubelet,
		"--http-addr", "", "--device-allow", "/dev/loop*",
	}, extra...)
	d.start()
	t.Cleanup(d.stop)
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	d.log = &bytes.Buffer{}
	d.cmd = exec.Command(filepath.Join(binDir, "crustd"), d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	if err := waitServing(d.socket, 20*time.Second); err != nil {
		d.stop()
		d.t.Fatalf("crustd did not come up: %v\n%s", err, d.log)
	}
}

// kill ends crustd with SIGKILL, as a crash would.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	_ = d.cmd.Wait()
	d.cmd = nil
}

func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
		d.t.Errorf("crustd did not stop on SIGTERM\n%s", d.log)
	}
	d.cmd = nil
}

func (d *daemon) conn() *grpc.ClientConn {
	d.t.Helper()
	c, err := client.Dial(d.socket)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = c.Close() })
	return c
}

func waitServing(socket string, timeout time.Duration) error {
	c, err := client.Dial(socket)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not serving after %s: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crustctl runs the CLI against d and returns stdout, stderr and the exit status.
func (d *daemon) crustctl(args ...string) (string, string, int) {
	d.t.Helper()
	return runAs(d.t, nil, filepath.Join(binDir, "crustctl"), append([]string{"--socket", d.socket}, args...)...)
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
	dir := filepath.Join(d.kubelet, "pods", pod, "volumes", "kubernetes.io~csi", pv)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		d.t.Fatal(err)
	}
	return filepath.Join(dir, "mount")
}
