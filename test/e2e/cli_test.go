package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestVersionAgrees builds the binaries with a version stamped as the Makefile stamps it, and checks that
// every --version, `crustctl version` and crustd's crust_build_info report the same build.
func TestVersionAgrees(t *testing.T) {
	const stamped = "v9.8.7-e2e"
	dir := t.TempDir()
	build := exec.Command("go", "build", "-ldflags", "-X crust.dev/crust/pkg/version.version="+stamped, "-o", dir+"/",
		"crust.dev/crust/cmd/...", "crust.dev/crust/test/csidriver/cmd/crust-lvm-csi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	line := regexp.MustCompile(`^(\S+) version (\S+) \(revision (\S+), (go\S+)\)\n`)
	var revision, goVersion string
	for _, c := range [][]string{
		{"crustd", "--version"}, {"crust-csi-proxy", "--version"}, {"crustctl", "--version"}, {"crustctl", "version"},
		{"crust-microvm", "--version"}, {"crust-lvm-csi", "--version"}, {"crust-guest", "--version"},
	} {
		out, errOut, code := runAs(t, nil, filepath.Join(dir, c[0]), c[1:]...)
		m := line.FindStringSubmatch(out)
		if code != 0 || m == nil || m[1] != c[0] || m[2] != stamped {
			t.Fatalf("%v: exit %d, printed %q (stderr %q); want %q version %s (revision …)", c, code, out, errOut, c[0], stamped)
		}
		if revision == "" {
			revision, goVersion = m[3], m[4]
		} else if m[3] != revision || m[4] != goVersion {
			t.Errorf("%v: revision %s %s, another binary said %s %s", c, m[3], m[4], revision, goVersion)
		}
	}
	// crustctl version says where crustd's version is to be found.
	if out, _, _ := runAs(t, nil, filepath.Join(dir, "crustctl"), "version"); !strings.Contains(out, "crust_build_info") {
		t.Errorf("crustctl version: %q does not say where crustd's version is", out)
	}

	root := t.TempDir()
	addr := freeAddr(t)
	sock := filepath.Join(root, "crust.sock")
	crustd := exec.Command(filepath.Join(dir, "crustd"), "--crust-socket", sock, "--state-dir", filepath.Join(root, "state"),
		"--kata-dir", "", "--kubelet-dir", root, "--http-addr", addr)
	var log strings.Builder
	crustd.Stderr = &log
	if err := crustd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = crustd.Process.Signal(syscall.SIGTERM); _ = crustd.Wait() }()
	if err := waitServing(sock, 20*time.Second); err != nil {
		t.Fatalf("crustd: %v\n%s", err, log.String())
	}
	_, body := httpGet(t, addr, "/metrics")
	want := fmt.Sprintf(`crust_build_info{goversion=%q,revision=%q,version=%q} 1`, goVersion, revision, stamped)
	if !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// TestSocketSpellings: --crust-socket, its old name --socket and CRUST_SOCKET all name crustd's socket,
// for crustd and for crustctl.
func TestSocketSpellings(t *testing.T) {
	d := newDaemon(t) // started with --socket, the old name
	ctl := filepath.Join(binDir, "crustctl")
	for _, c := range []struct {
		name string
		env  []string
		args []string
	}{
		{"flag", nil, []string{"--crust-socket", d.socket, "ls"}},
		{"old flag", nil, []string{"--socket=" + d.socket, "ls"}},
		{"environment", []string{"CRUST_SOCKET=" + d.socket}, []string{"ls"}},
		{"flag beats environment", []string{"CRUST_SOCKET=/nonexistent.sock"}, []string{"--crust-socket", d.socket, "ls"}},
	} {
		cmd := exec.Command(ctl, c.args...)
		cmd.Env = append(os.Environ(), c.env...)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "TARGET") {
			t.Errorf("%s: %v: %s", c.name, err, out)
		}
	}
	if !strings.Contains(d.log.String(), "--socket is an old name of --crust-socket") {
		t.Errorf("crustd did not warn of --socket:\n%s", d.log)
	}
}

// TestDialErrorsSayWhatToCheck: a missing socket names crustd, the path and how to name another; a
// socket this user may not reach names root and --allow-uid.
func TestDialErrorsSayWhatToCheck(t *testing.T) {
	ctl := filepath.Join(binDir, "crustctl")
	missing := filepath.Join(t.TempDir(), "none.sock")
	_, errOut, code := runAs(t, nil, ctl, "--crust-socket", missing, "--timeout", "5s", "ls")
	if code != 1 || !strings.Contains(errOut, "Unavailable") || !strings.Contains(errOut, "no crustd is serving at "+missing) ||
		!strings.Contains(errOut, "--crust-socket or CRUST_SOCKET") {
		t.Errorf("missing socket: exit %d: %s", code, errOut)
	}

	d := newDaemon(t) // its socket is mode 0600, under directories of mode 0700
	if err := os.Chmod(filepath.Dir(d.root), 0o755); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runAs(t, &syscall.Credential{Uid: 1000, Gid: 1000}, ctl, "--crust-socket", d.socket, "--timeout", "5s", "ls")
	if code != 1 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, "run as root") ||
		!strings.Contains(errOut, "--allow-uid/--allow-gid admit uid 1000") {
		t.Errorf("socket out of reach: exit %d: %s", code, errOut)
	}
}

// TestWatchTable: `crustctl watch -o table` prints a header and a row an event, as they happen.
func TestWatchTable(t *testing.T) {
	d := newDaemon(t)
	dev := loopDevice(t, 16<<20)
	target := d.podTarget("pod-wt", "pv")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	watch := exec.CommandContext(ctx, filepath.Join(binDir, "crustctl"), "--crust-socket", d.socket, "watch", "--existing", "-o", "table")
	out, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = watch.Wait() }()
	lines := bufio.NewScanner(out)
	next := func() []string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("watch ended: %v", lines.Err())
		}
		return strings.Fields(lines.Text())
	}
	if h := next(); strings.Join(h, " ") != "REVISION EVENT TARGET SANDBOX DETAIL" {
		t.Fatalf("header %q", h)
	}
	if r := next(); len(r) < 2 || r[1] != "synced" {
		t.Fatalf("first row %q, want synced", r)
	}
	if _, errOut, code := d.crustctl("stage", "--target-path", target, "--device", dev, "--fs-type", "xfs"); code != 0 {
		t.Fatalf("stage: %s", errOut)
	}
	if r := next(); len(r) < 4 || r[1] != "staged" || r[2] != target || r[3] != "-" {
		t.Fatalf("row %q, want staged %s", r, target)
	}
	if _, errOut, code := d.crustctl("claim", target, "--sandbox-id", "sb-t", "--endpoint", "unix:///run/handler.sock"); code != 0 {
		t.Fatalf("claim: %s", errOut)
	}
	if r := next(); len(r) < 4 || r[1] != "claimed" || r[3] != "sb-t" {
		t.Fatalf("row %q, want claimed by sb-t", r)
	}
	// A bad -o is refused before the stream starts.
	if _, errOut, code := d.crustctl("watch", "-o", "xml"); code != 2 || !strings.Contains(errOut, `-o: "xml"`) {
		t.Errorf("watch -o xml: exit %d: %s", code, errOut)
	}
}
