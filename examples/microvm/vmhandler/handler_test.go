package vmhandler

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// The VM side of the handler is tested end to end in test/e2e (TestMicroVMHandler); these tests cover
// what needs no VM.

func TestParseVolume(t *testing.T) {
	for in, want := range map[string]Volume{
		"/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount:/data": {"/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount", "/data"},
		"/a:b:/data/x": {"/a:b", "/data/x"},
	} {
		if got, err := ParseVolume(in); err != nil || got != want {
			t.Errorf("ParseVolume(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/a", "/a:", ":/data", "a:/data", "/a:data", "/a:/", "/a/../b:/data", "/a:/data/"} {
		if got, err := ParseVolume(in); err == nil {
			t.Errorf("ParseVolume(%q) = %+v, want an error", in, got)
		}
	}
}

func TestDiskID(t *testing.T) {
	// What vm.AttachBlock accepts, and virtio-blk's 20-byte serial.
	valid := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,19}$`)
	a, b := DiskID("/k/pods/p/volumes/x/pv1/mount"), DiskID("/k/pods/p/volumes/x/pv2/mount")
	if !valid.MatchString(a) || len(a) != 20 || a == b || a != DiskID("/k/pods/p/volumes/x/pv1/mount") {
		t.Errorf("DiskID: %q, %q", a, b)
	}
}

func TestCheckDevice(t *testing.T) {
	f := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(f, &st); err != nil {
		t.Fatal(err)
	}
	vol := func(typ crustv1.VolumeType, ino uint64) *crustv1.Volume {
		return &crustv1.Volume{
			Spec:         &crustv1.VolumeSpec{VolumeType: typ},
			DeviceNumber: &crustv1.DeviceNumber{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), Inode: ino},
		}
	}
	if err := checkDevice(vol(crustv1.VolumeType_VOLUME_TYPE_FILE, st.Ino), f); err != nil {
		t.Errorf("the staged image file: %v", err)
	}
	if err := checkDevice(vol(crustv1.VolumeType_VOLUME_TYPE_FILE, st.Ino+1), f); err == nil {
		t.Error("another inode was accepted")
	}
	if err := checkDevice(vol(crustv1.VolumeType_VOLUME_TYPE_BLOCK, 0), f); err == nil {
		t.Error("a regular file was accepted as a block device")
	}
	if err := checkDevice(vol(crustv1.VolumeType_VOLUME_TYPE_FILE, st.Ino), f+".gone"); err == nil {
		t.Error("a missing file was accepted")
	}
}

// TestStateDir: one run per name; the files a dead run left are cleaned by the next run or by Stop, and
// a process that is not that sandbox's QEMU is never killed.
func TestStateDir(t *testing.T) {
	parent := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	st, err := lockState(parent, "sb", log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockState(parent, "sb", log); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second lock: %v", err)
	}
	st.unlock()

	leave := func() {
		for _, name := range stale {
			if err := os.WriteFile(st.path(name), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// A live process that is not this sandbox's QEMU: init.
		if err := os.WriteFile(st.path(pidFile), []byte("1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	leave()
	var logged bytes.Buffer
	st, err = lockState(parent, "sb", slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	st.unlock()
	if !strings.Contains(logged.String(), "cleaned up after an earlier run") || strings.Contains(logged.String(), "qemu pid") {
		t.Errorf("log: %s", logged.String())
	}
	leave()
	if err := Stop(context.Background(), parent, "sb"); err != nil {
		t.Fatal(err)
	}
	for _, name := range stale {
		if _, err := os.Stat(st.path(name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Stop of a dead sandbox: %v", name, err)
		}
	}
	if err := Stop(context.Background(), parent, "never-ran"); err != nil {
		t.Errorf("Stop of an unknown sandbox: %v", err)
	}
	if _, err := Exec(context.Background(), parent, "sb", []string{"true"}); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Exec on a dead sandbox: %v", err)
	}
	if _, err := Health(context.Background(), parent, "sb", true); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Health on a dead sandbox: %v", err)
	}
}

// A QEMU left by a dead run of the same state directory is killed, and gone, before the run starts; the
// stand-in is a process whose command line names the directory's QMP socket, as QEMU's does.
func TestStaleQEMUKilled(t *testing.T) {
	parent := t.TempDir()
	st, err := lockState(parent, "sb", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	st.unlock()
	qemu := exec.Command("sh", "-c", "read x", st.path("qmp.sock")) // waits on its stdin
	if _, err := qemu.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = qemu.Process.Kill(); _ = qemu.Wait() })
	if err := os.WriteFile(st.path(pidFile), []byte(strconv.Itoa(qemu.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	st, err = lockState(parent, "sb", slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	st.unlock()
	if !strings.Contains(logged.String(), "qemu pid "+strconv.Itoa(qemu.Process.Pid)) {
		t.Errorf("the stale QEMU was not reported killed: %s", logged.String())
	}
	if alive(qemu.Process.Pid) {
		t.Error("the stale QEMU is alive after the run started")
	}
}

// TestControl: exec and health before the VM is up are refused; Stop reaches the run side, waits for its teardown
// and returns its outcome.
func TestControl(t *testing.T) {
	parent := t.TempDir()
	st, err := lockState(parent, "sb", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l, err := listenControl(st.path(controlSocket))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(st.path(controlSocket)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket: %v, %v", fi.Mode(), err)
	}
	c := newControl()
	wait := c.serve(l)

	_, err = Exec(context.Background(), parent, "sb", []string{"true"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("exec before boot: %v", err)
	}
	if _, err := Health(context.Background(), parent, "sb", true); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("health before boot: %v", err)
	}

	// The run side: on a stop request, tear down (here: nothing), answer, let the lock go.
	go func() {
		<-c.stopReq
		time.Sleep(50 * time.Millisecond)
		_ = l.Close()
		c.finish(errors.New("volume /x: unmount: busy"))
		wait(time.Second)
		st.unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Stop(ctx, parent, "sb"); err == nil || !strings.Contains(err.Error(), "unmount: busy") {
		t.Errorf("Stop = %v, want the teardown's error", err)
	}
	if _, err := os.Stat(st.path(controlSocket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket left: %v", err)
	}
}

func TestMainUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"run"}, ExitUsage},
		{[]string{"run", "--name", "x", "--volume", "/a"}, ExitUsage},
		{[]string{"run", "--name", "../x"}, ExitUsage},
		{[]string{"run", "--name", "x", "--accel", "hvf"}, ExitUsage},
		{[]string{"exec", "x"}, ExitUsage},
		{[]string{"stop"}, ExitUsage},
		{[]string{"frobnicate"}, ExitUsage},
		{[]string{"--state-dir", dir, "exec", "x", "--", "true"}, ExitExecFailed},
		{[]string{"--state-dir", dir, "stop", "x"}, 0},
	} {
		var out, errOut bytes.Buffer
		if code := Main(c.args, &out, &errOut); code != c.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", c.args, code, c.code, errOut.String())
		}
	}
}

// One target at several guest paths is one volume mounted at each; a guest path given twice is refused.
func TestOneTargetAtSeveralGuestPaths(t *testing.T) {
	vols := []Volume{{"/k/a", "/data/a"}, {"/k/b", "/data/b"}, {"/k/a", "/other/a"}, {"/k/a", "/third"}}
	cfg := Config{Name: "sb", Volumes: vols}
	if err := cfg.setDefaults(); err != nil {
		t.Fatalf("a target at three guest paths: %v", err)
	}
	s := newSandbox("sb", nil, nil, vols, nil)
	if len(s.order) != 2 || s.order[0].Target != "/k/a" || s.order[1].Target != "/k/b" {
		t.Fatalf("volumes %v, want /k/a then /k/b", s.order)
	}
	if a := s.byTarget["/k/a"]; a.GuestPath != "/data/a" || !slices.Equal(a.also, []string{"/other/a", "/third"}) {
		t.Errorf("/k/a is at %s and %v, want /data/a and [/other/a /third]", a.GuestPath, a.also)
	}
	cfg = Config{Name: "sb", Volumes: []Volume{{"/k/a", "/data"}, {"/k/b", "/data"}}}
	if err := cfg.setDefaults(); err == nil || !strings.Contains(err.Error(), "guest path given twice") {
		t.Errorf("two volumes at one guest path: %v", err)
	}
}
