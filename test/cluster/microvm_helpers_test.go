package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"crust.dev/crust/internal/testutil/harness"
)

// runcClass is the RuntimeClass of runc, which pods that run on the host name: the node's default runtime
// is the microVM's (hack/cluster/lib.sh, DEFAULT_RUNTIME).
const runcClass = "runc"

// kataClass is the RuntimeClass whose handler runc serves as a stand-in for Kata (hack/cluster/up.sh):
// for the tests that play Kata's shim themselves.
const kataClass = "kata"

// podShell runs commands in one container of a running pod, through kubectl exec.
type podShell struct {
	c                  *cluster
	t                  *testing.T
	ns, pod, container string
}

// shell is a podShell for container of pod in ns.
func (c *cluster) shell(t *testing.T, ns, pod, container string) *podShell {
	return &podShell{c: c, t: t, ns: ns, pod: pod, container: container}
}

// Exec runs argv in the container and returns its output and whether it succeeded.
func (s *podShell) Exec(argv ...string) (string, error) {
	return s.c.kubectlRun(append([]string{"-n", s.ns, "exec", s.pod, "-c", s.container, "--"}, argv...)...)
}

// ExecOK runs argv in the container and returns its output, failing the test when it fails.
func (s *podShell) ExecOK(argv ...string) string {
	s.t.Helper()
	out, err := s.Exec(argv...)
	if err != nil {
		s.t.Fatalf("in %s/%s[%s]: %s: %v\n%s", s.ns, s.pod, s.container, strings.Join(argv, " "), err, out)
	}
	return out
}

// hostKernel is the node's kernel release.
func hostKernel(t *testing.T) string {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// assertInGuest checks that the container runs in the microVM's guest (its kernel is not the node's)
// and that path is mounted there from a virtio disk (/dev/vd*); it returns the device.
func assertInGuest(t *testing.T, s *podShell, path string) string {
	t.Helper()
	if k := strings.TrimSpace(s.ExecOK("uname", "-r")); k == hostKernel(t) || k == "" {
		t.Fatalf("the container runs on the node's kernel %q, not in a guest", k)
	}
	for _, l := range strings.Split(s.ExecOK("cat", "/proc/mounts"), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[1] == path {
			if !strings.HasPrefix(f[0], "/dev/vd") {
				t.Fatalf("%s in the container is mounted from %s, not a virtio disk", path, f[0])
			}
			return f[0]
		}
	}
	t.Fatalf("nothing is mounted at %s in the container", path)
	return ""
}

// shimStateDir is the node's state directory of the shim's sandbox (containerd-shim-crust-microvm-v1:
// /run/crust-microvm/<first 16 of the sandbox id>).
func shimStateDir(sandbox string) string {
	return filepath.Join("/run/crust-microvm", sandbox[:min(16, len(sandbox))])
}

// assertSandboxGone checks that nothing of the microVM sandbox is left on the node: no process naming it
// (its shim, by the sandbox id, and its QEMU and virtiofsd, by the state directory), and no state
// directory (its sockets, shares and mounts).
func (c *cluster) assertSandboxGone(t *testing.T, sandbox string) {
	t.Helper()
	dir := shimStateDir(sandbox)
	waitFor(t, time.Minute, "the sandbox's VM, virtiofsd and state gone", func() (bool, error) {
		if procs := harness.ProcessesNaming(filepath.Base(dir)); len(procs) > 0 {
			return false, fmt.Errorf("still running: %v", procs)
		}
		if _, err := os.Lstat(c.nsPath(dir)); !os.IsNotExist(err) {
			return false, fmt.Errorf("%s still there (%v)", dir, err)
		}
		return true, nil
	})
	if m := c.nsMounts(t, dir); len(m) != 0 {
		t.Errorf("mounts left of the sandbox: %v", m)
	}
}

// kubectlTTY runs kubectl with a terminal on its standard input and output (script(1) gives it one), as a
// user at a terminal would, and returns what it printed.
func (c *cluster) kubectlTTY(t *testing.T, args ...string) string {
	t.Helper()
	var line []string
	for _, a := range append([]string{c.kubectl, "--kubeconfig", c.kubeconfig}, args...) {
		line = append(line, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'") // script(1) runs a shell's command line
	}
	cmd := exec.Command("script", "-qec", strings.Join(line, " "), "/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s with a terminal: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// assertPodNetworkInGuest checks that the microVM pod vm's IP answers from inside its guest: the guest's
// eth0 holds the pod's IP, and a server started in the container is reached from the runc pod on the
// pod network (the node's bridge: nothing leaves the machine).
func (c *cluster) assertPodNetworkInGuest(t *testing.T, ns string, vm, runc *corev1.Pod) {
	t.Helper()
	in := c.shell(t, ns, vm.Name, vm.Spec.Containers[0].Name)
	if out := in.ExecOK("ip", "-4", "addr", "show", "eth0"); !strings.Contains(out, " "+vm.Status.PodIP+"/") {
		t.Fatalf("the guest's eth0 does not hold the pod's IP %s:\n%s", vm.Status.PodIP, out)
	}
	in.ExecOK("sh", "-c", "mkdir -p /tmp/www && echo served-from-the-guest > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")
	get := fmt.Sprintf(`printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 20 %s 8080`, vm.Status.PodIP)
	if out := c.shell(t, ns, runc.Name, runc.Spec.Containers[0].Name).ExecOK("sh", "-c", get); !strings.Contains(out, "served-from-the-guest") {
		t.Fatalf("the runc pod got %q from the microVM pod's IP %s", out, vm.Status.PodIP)
	}
	t.Logf("the microVM pod's IP %s answered from the guest", vm.Status.PodIP)
}
