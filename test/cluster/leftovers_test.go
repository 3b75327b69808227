package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hostState is what the cluster may change on the host and must leave as it found it.
type hostState struct {
	sysctls map[string]string
	dirs    map[string]bool // the host directories the node's mount namespace binds over
}

// madeVolumes holds the ids of the volumes made in the tier's cluster (watchVolumes): the example
// driver's extent-map file of a volume is named after its id (csi-<40 hex>), and a loop device on such a
// file is the tier's only when the id is one of these. Another process on the machine may attach files of
// the same shape (the e2e tier runs the same driver).
var madeVolumes = struct {
	sync.Mutex
	ids map[string]bool
}{ids: map[string]bool{}}

// watchVolumes records the id of every persistent volume of the cluster until ctx ends.
func (c *cluster) watchVolumes(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := c.cs.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{})
		if err != nil {
			return // the leftover check then looks at $RUN's files only
		}
		for ev := range w.ResultChan() {
			if pv, ok := ev.Object.(*corev1.PersistentVolume); ok && pv.Spec.CSI != nil {
				madeVolumes.Lock()
				madeVolumes.ids[pv.Spec.CSI.VolumeHandle] = true
				madeVolumes.Unlock()
			}
		}
	}
}

// madeBacking reports whether a loop device's backing file is the tier's: under run, or the extent-map
// file of a volume its tests made.
func madeBacking(run, file string) bool {
	madeVolumes.Lock()
	defer madeVolumes.Unlock()
	return strings.HasPrefix(file, run) || madeVolumes.ids[filepath.Base(file)]
}

var watchedSysctls = []string{"kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory", "vm.panic_on_oom",
	"net.ipv4.ip_forward", "net.ipv4.conf.all.route_localnet"}

var watchedDirs = []string{"/var/lib/kubelet", "/var/lib/cni", "/var/log/pods", "/run/containerd"}

func readHostState() hostState {
	s := hostState{sysctls: map[string]string{}, dirs: map[string]bool{}}
	for _, k := range watchedSysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/")))
		if err == nil {
			s.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	for _, d := range watchedDirs {
		_, err := os.Lstat(d)
		s.dirs[d] = err == nil
	}
	return s
}

// leftovers lists what the cluster left on the host after make cluster-down, against the state before
// make cluster-up: processes, mounts and loop devices of $RUN and of the volumes the tests made, the bridge, kubelet's cgroups and iptables
// chains, changed sysctls, and host directories it created.
func leftovers(root, run string, before hostState) []string {
	var found []string
	out, _ := exec.Command("pgrep", "-af", run+"|"+filepath.Join(root, "_output", "k8s", "bin")).Output()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" && !strings.Contains(l, "pgrep") {
			found = append(found, "process: "+l)
		}
	}
	mps, _ := mountsIn("/proc/self/mountinfo", run)
	for _, mp := range mps {
		found = append(found, "mount: "+mp)
	}
	out, _ = exec.Command("losetup", "-n", "-l", "-O", "NAME,BACK-FILE").Output()
	for _, l := range strings.Split(string(out), "\n") {
		// The example driver's extent-map files, once its FUSE mount is gone, show as csi-<40 hex>.
		if f := strings.Fields(l); len(f) == 2 && madeBacking(run, f[1]) {
			found = append(found, "loop device: "+l)
		}
	}
	if _, err := os.Lstat("/dev/crust-example"); err == nil {
		found = append(found, "/dev/crust-example (the example driver's device links)")
	}
	if exec.Command("ip", "link", "show", "k8stest0").Run() == nil {
		found = append(found, "network interface k8stest0")
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(m) > 0 {
		found = append(found, fmt.Sprintf("cgroups: %v", m))
	}
	if out, err := exec.Command("iptables-save").Output(); err == nil && strings.Contains(string(out), "KUBE-") {
		found = append(found, "iptables chains named KUBE-")
	}
	after := readHostState()
	for k, v := range before.sysctls {
		if after.sysctls[k] != v {
			found = append(found, fmt.Sprintf("sysctl %s: %s, was %s", k, after.sysctls[k], v))
		}
	}
	for d, existed := range before.dirs {
		if after.dirs[d] && !existed {
			found = append(found, "directory "+d)
		}
	}
	return found
}

// TestClusterUpClearsRemains checks how cluster-up clears the remains of a cluster killed before
// cluster-down (lib.sh's clear_remains): a bridge of the CNI bridge's name with no ports is removed, and a
// loop device carrying a physical volume of the example volume group is detached; a bridge with ports, or
// an interface of that name that is not a bridge, is refused, named and left as it is, and so is every
// other loop device. It runs with a bridge and volume group name of its own, so that the tier's cluster
// is not touched, and checks that the cluster's volume group stays attached.
func TestClusterUpClearsRemains(t *testing.T) {
	c := get(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := "crusttb" + hex.EncodeToString(b[:]) // 13 bytes: interface names have at most 15
	// libRun runs script with lib.sh, the bridge and the volume group named name.
	libRun := func(script string, args ...string) (string, error) {
		return c.lib([]string{"BRIDGE=" + name, "VG_NAME=" + name}, script, args...)
	}
	run := func(t *testing.T, name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	exists := func(n string) bool { return exec.Command("ip", "link", "show", n).Run() == nil }
	attached := func(dev string) bool {
		out, _ := exec.Command("losetup", "-n", "-l", "-O", "NAME").Output()
		return slices.Contains(strings.Fields(string(out)), dev)
	}
	clusterVG, err := os.ReadFile(filepath.Join(c.run, "vg", "device"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		make    func(t *testing.T) (loop string) // what a killed cluster left; loop is a loop device made, if any
		wantErr string                           // "" when clear_remains must succeed and leave none of it
	}{
		{name: "nothing left"},
		{name: "idle bridge", make: func(t *testing.T) string { run(t, "ip", "link", "add", name, "type", "bridge"); return "" }},
		{name: "volume group's loop device", make: func(t *testing.T) string {
			f := filepath.Join(t.TempDir(), "pv.img")
			run(t, "truncate", "-s", "64M", f)
			dev := run(t, "losetup", "--find", "--show", f)
			t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
			if out, err := libRun(`lvm_ "$1" pvcreate --yes "$1" && lvm_ "$1" vgcreate --yes "$VG_NAME" "$1"`, dev); err != nil {
				t.Fatalf("making volume group %s on %s: %v\n%s", name, dev, err, out)
			}
			return dev
		}},
		{name: "bridge with a port", wantErr: "has ports (" + name + "p)", make: func(t *testing.T) string {
			run(t, "ip", "link", "add", name, "type", "bridge")
			run(t, "ip", "link", "add", name+"p", "type", "veth", "peer", "name", name+"q")
			run(t, "ip", "link", "set", name+"p", "master", name)
			return ""
		}},
		{name: "not a bridge", wantErr: "is not a bridge", make: func(t *testing.T) string {
			run(t, "ip", "link", "add", name, "type", "veth", "peer", "name", name+"q")
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				// Deleting one end of a veth pair deletes both.
				_ = exec.Command("ip", "link", "del", name+"p").Run()
				_ = exec.Command("ip", "link", "del", name).Run()
			})
			var loop string
			if tc.make != nil {
				loop = tc.make(t)
			}
			out, err := libRun("clear_remains")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("clear_remains: %v\n%s", err, out)
			case tc.wantErr == "" && exists(name):
				t.Fatalf("clear_remains left the bridge %s\n%s", name, out)
			case tc.wantErr == "" && loop != "" && attached(loop):
				t.Fatalf("clear_remains left %s attached\n%s", loop, out)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("clear_remains succeeded, want an error naming %q\n%s", tc.wantErr, out)
			case tc.wantErr != "" && !strings.Contains(out, tc.wantErr):
				t.Fatalf("clear_remains said %q, want %q", out, tc.wantErr)
			case tc.wantErr != "" && !exists(name):
				t.Fatalf("clear_remains removed %s, which it refused", name)
			}
			if dev := strings.TrimSpace(string(clusterVG)); !attached(dev) {
				t.Fatalf("clear_remains detached %s, the cluster's volume group", dev)
			}
		})
	}
}

// lib runs script with bash once it has sourced hack/cluster/lib.sh, with env added to the environment,
// and returns what it printed.
func (c *cluster) lib(env []string, script string, args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{"-c", "source \"$0\" || exit\n" + script,
		filepath.Join(c.root, "hack", "cluster", "lib.sh")}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestRecordedProcesses checks how hack/cluster/lib.sh names the node's processes, which down.sh stops:
// a process records itself (RECORD_SELF) as its pid and start time, and a record stands for a running
// process only while that pid has that start time. A record of a process that is gone, whose pid another
// process may have by now, or a record without a start time, stands for none, so down.sh stops nothing
// through it.
func TestRecordedProcesses(t *testing.T) {
	c := get(t)
	run := t.TempDir()
	if err := os.Mkdir(filepath.Join(run, "pids"), 0o755); err != nil {
		t.Fatal(err)
	}
	sh := func(script string, args ...string) (string, error) {
		return c.lib([]string{"RUN=" + run}, script, args...)
	}
	record := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(run, "pids", name+".pid"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	alive := func(name string) bool { _, err := sh(`pid_alive "$1"`, name); return err == nil }
	startTime := func(pid int) string {
		t.Helper()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		return strings.Fields(s[strings.LastIndex(s, ")")+2:])[19] // field 22
	}

	// A process that records itself as start() makes it do, then execs.
	if out, err := sh(`sh -c "pidfile=\$0; $RECORD_SELF; exec sleep 600" "$RUN/pids/self.pid" >/dev/null 2>&1 &
		wait_for 5 "the record" test -s "$RUN/pids/self.pid"`); err != nil {
		t.Fatalf("recording: %v\n%s", err, out)
	}
	pid, err := (&cluster{run: run}).recordedPID("self")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	})
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "sleep" {
		t.Fatalf("recorded pid %d is %q, not the sleep the recording shell exec'd", pid, comm)
	}
	if !alive("self") {
		t.Fatalf("the record of running process %d stands for none", pid)
	}
	st := startTime(pid)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, record string }{
		{"another start time", fmt.Sprintf("%d %s1\n", pid, st)},
		{"no start time", fmt.Sprintf("%d\n", pid)},
		{"a process that is gone", fmt.Sprintf("%d %s\n", gone.Process.Pid, st)},
		{"empty", ""},
	} {
		record("x", tc.record)
		if alive("x") {
			t.Errorf("%s: record %q stands for a running process", tc.name, tc.record)
		}
	}
	if err := os.Remove(filepath.Join(run, "pids", "x.pid")); err != nil {
		t.Fatal(err)
	}
	if alive("x") {
		t.Error("no record stands for a running process")
	}
}
