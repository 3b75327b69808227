//go:build linux

package guest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// readAll reads a stream until its end.
func readAll(t *testing.T, a agentv1.AgentServiceService, id, exec string, s agentv1.Stream) string {
	t.Helper()
	var out strings.Builder
	for {
		r, err := a.ReadStream(context.Background(), &agentv1.ReadStreamRequest{ContainerId: id, ExecId: exec, Stream: s})
		if err != nil {
			t.Fatalf("ReadStream %s/%s %v: %v", id, exec, s, err)
		}
		out.Write(r.GetData())
		if r.GetEof() {
			return out.String()
		}
	}
}

// readUntil reads a stream until it holds want.
func readUntil(t *testing.T, a agentv1.AgentServiceService, id, exec, want string) string {
	t.Helper()
	var out strings.Builder
	for !strings.Contains(out.String(), want) {
		r, err := a.ReadStream(context.Background(), &agentv1.ReadStreamRequest{ContainerId: id, ExecId: exec, Stream: agentv1.Stream_STREAM_STDOUT})
		if err != nil || r.GetEof() {
			t.Fatalf("ReadStream %s/%s: %v, eof %v, before %q in %q", id, exec, err, r.GetEof(), want, out.String())
		}
		out.Write(r.GetData())
	}
	return out.String()
}

func wait(t *testing.T, a agentv1.AgentServiceService, id, exec string) int32 {
	t.Helper()
	r, err := a.WaitProcess(context.Background(), &agentv1.WaitProcessRequest{ContainerId: id, ExecId: exec})
	if err != nil {
		t.Fatalf("WaitProcess %s/%s: %v", id, exec, err)
	}
	return r.GetExitStatus()
}

func start(t *testing.T, a agentv1.AgentServiceService, id, exec string, p *agentv1.Process, stdin bool) {
	t.Helper()
	if _, err := a.StartProcess(context.Background(), &agentv1.StartProcessRequest{ContainerId: id, ExecId: exec, Process: p, Stdin: stdin}); err != nil {
		t.Fatalf("StartProcess %s/%s %q: %v", id, exec, p.GetArgs(), err)
	}
}

// TestContainers boots one guest and runs containers in it as the shim does: a rootfs and a bind source
// on the virtio-fs share, the guest's own proc, /dev and devpts, a user's process with its output,
// exit status, an exec'd process with stdin, a terminal, signals and the removal.
func TestContainers(t *testing.T) {
	share := t.TempDir()
	v, assets := bootWithShare(t, share)
	tinyRootfs(t, filepath.Join(share, "c1", "rootfs"), filepath.Join(assets.Tools, "bin", "busybox"))
	if err := os.MkdirAll(filepath.Join(share, "c1", "mounts", "0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "c1", "mounts", "0", "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := v.Agent()
	ctx := context.Background()
	for range 2 { // the second is a no-op
		if _, err := a.MountShare(ctx, &agentv1.MountShareRequest{Tag: "crust-shared", Target: "/run/crust/shared"}); err != nil {
			t.Fatal(err)
		}
	}
	create := &agentv1.CreateContainerRequest{ContainerId: "c1", Root: "/run/crust/shared/c1/rootfs", ReadOnlyRoot: true,
		Hostname: "pod1", Mounts: []*agentv1.ContainerMount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/data", Type: "bind", Source: "/run/crust/shared/c1/mounts/0", Options: []string{"rbind", "ro"}},
		}}
	bad := &agentv1.CreateContainerRequest{ContainerId: "bad", Root: create.Root,
		Mounts: []*agentv1.ContainerMount{{Destination: "../etc", Type: "tmpfs"}}}
	if _, err := a.CreateContainer(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "mounts[0].destination") {
		t.Errorf("CreateContainer with a relative destination: %v, want INVALID_ARGUMENT naming mounts[0].destination", err)
	}
	if _, err := a.CreateContainer(ctx, create); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateContainer(ctx, create); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("CreateContainer again: %v, want ALREADY_EXISTS", err)
	}

	user := &agentv1.Process{Args: []string{"sh", "-c", "echo out; echo err >&2; id; pwd; cat /data/hello; echo $FOO; exit 3"},
		Env: []string{"PATH=/bin", "FOO=bar"}, Cwd: "/tmp", Uid: 1000, Gid: 1000, AdditionalGids: []uint32{2000}}
	start(t, a, "c1", "", user, false)
	stdout := readAll(t, a, "c1", "", agentv1.Stream_STREAM_STDOUT)
	if stderr := readAll(t, a, "c1", "", agentv1.Stream_STREAM_STDERR); stderr != "err\n" {
		t.Errorf("stderr %q, want err", stderr)
	}
	if !regexp.MustCompile(`^out\nuid=1000\(user\) gid=1000\(user\) groups=.*2000.*\n/tmp\nfrom the host\nbar\n$`).MatchString(stdout) {
		t.Errorf("stdout %q", stdout)
	}
	if st := wait(t, a, "c1", ""); st != 3 {
		t.Errorf("exit status %d, want 3", st)
	}
	if _, err := a.StartProcess(ctx, &agentv1.StartProcessRequest{ContainerId: "c1", ExecId: "late", Process: user}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("an exec after the first process exited: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := a.RemoveContainer(ctx, &agentv1.RemoveContainerRequest{ContainerId: "c1"}); err != nil {
		t.Fatal(err)
	}

	// The same root again: a long first process, execs beside it, a signal.
	create.ContainerId = "c2"
	if _, err := a.CreateContainer(ctx, create); err != nil {
		t.Fatal(err)
	}
	root := &agentv1.Process{Env: []string{"PATH=/bin"}, Bounding: []string{"CAP_KILL"}, Effective: []string{"CAP_KILL"},
		Permitted: []string{"CAP_KILL"}}
	run := func(exec string, stdin bool, args ...string) {
		p := root
		p.Args = args
		start(t, a, "c2", exec, p, stdin)
	}
	if _, err := a.StartProcess(ctx, &agentv1.StartProcessRequest{ContainerId: "c2", Process: &agentv1.Process{Args: []string{"nope"}}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("StartProcess of a missing executable: %v, want NOT_FOUND", err)
	}
	run("", false, "sleep", "1000")
	run("ro", false, "touch", "/newfile")
	if st := wait(t, a, "c2", "ro"); st == 0 {
		t.Error("a write to the read-only root succeeded")
	}
	run("cat", true, "cat")
	if _, err := a.WriteStdin(ctx, &agentv1.WriteStdinRequest{ContainerId: "c2", ExecId: "cat", Data: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CloseStdin(ctx, &agentv1.CloseStdinRequest{ContainerId: "c2", ExecId: "cat"}); err != nil {
		t.Fatal(err)
	}
	if out := readAll(t, a, "c2", "cat", agentv1.Stream_STREAM_STDOUT); out != "hi" {
		t.Errorf("cat answered %q, want hi", out)
	}
	if st := wait(t, a, "c2", "cat"); st != 0 {
		t.Errorf("cat's exit status %d", st)
	}
	tty := &agentv1.Process{Args: []string{"tty"}, Env: []string{"PATH=/bin"}, Terminal: true}
	start(t, a, "c2", "tty", tty, true)
	if _, err := a.ResizeTerminal(ctx, &agentv1.ResizeTerminalRequest{ContainerId: "c2", ExecId: "tty", Width: 100, Height: 30}); err != nil {
		t.Error(err)
	}
	if out := readAll(t, a, "c2", "tty", agentv1.Stream_STREAM_STDOUT); !regexp.MustCompile(`^/dev/pts/[0-9]+\r\n$`).MatchString(out) {
		t.Errorf("tty printed %q", out)
	}
	// A terminal of its own, and capabilities as asked: the sh of an exec sees it all.
	run("sh", true, "sh", "-c", "grep -E '^Cap(Eff|Bnd)' /proc/self/status; echo ready; cat")
	if out := readUntil(t, a, "c2", "sh", "ready"); !strings.Contains(out, "CapEff:\t0000000000000020") || !strings.Contains(out, "CapBnd:\t0000000000000020") {
		t.Errorf("capabilities: %q, want only CAP_KILL (0x20)", out)
	}
	if _, err := a.SignalProcess(ctx, &agentv1.SignalProcessRequest{ContainerId: "c2", Signal: int32(unix.SIGTERM)}); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, a, "c2", ""); st != 128+int32(unix.SIGTERM) {
		t.Errorf("sleep's exit status %d, want 143", st)
	}
	if st := wait(t, a, "c2", "sh"); st != 128+int32(unix.SIGKILL) {
		t.Errorf("the exec's exit status %d after the first process ended, want 137", st)
	}
	if _, err := a.RemoveContainer(ctx, &agentv1.RemoveContainerRequest{ContainerId: "c2"}); err != nil {
		t.Fatal(err)
	}
	res, err := a.Exec(ctx, &agentv1.ExecRequest{Argv: []string{"cat", "/proc/self/mountinfo"}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(res.GetStdout()), "/run/crust/containers") {
		t.Errorf("mounts left under /run/crust/containers:\n%s", res.GetStdout())
	}
}
