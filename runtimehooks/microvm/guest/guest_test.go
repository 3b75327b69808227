//go:build linux

package guest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/runtimehooks/microvm/agentproto"
	"crust.dev/crust/runtimehooks/microvm/agentproto/agentv1"
)

func TestFSGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("fsGroup needs root to change groups")
	}
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(root, "sub")
	file := filepath.Join(sub, "f")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o604); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(sub, "link")); err != nil {
		t.Fatal(err)
	}
	const gid = 4321
	check := func(p string, wantMode uint32) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != gid || st.Mode&^unix.S_IFMT != wantMode {
			t.Errorf("%s: gid %d mode %o, want gid %d mode %o", p, st.Gid, st.Mode&^unix.S_IFMT, gid, wantMode)
		}
	}

	// OnRootMismatch on a root that does not match walks everything.
	if err := applyFSGroup(root, gid, agentv1.FsGroupPolicy_FS_GROUP_POLICY_ON_ROOT_MISMATCH); err != nil {
		t.Fatal(err)
	}
	check(root, 0o2775)
	check(sub, 0o2770)
	check(file, 0o664)
	check(filepath.Join(sub, "link"), 0o777)

	// Now the root matches: OnRootMismatch leaves a changed file alone,
	// Always fixes it.
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := applyFSGroup(root, gid, agentv1.FsGroupPolicy_FS_GROUP_POLICY_ON_ROOT_MISMATCH); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	_ = unix.Stat(file, &st)
	if st.Mode&0o777 != 0o600 {
		t.Fatalf("OnRootMismatch walked a matching root (file mode %o)", st.Mode&0o777)
	}
	if err := applyFSGroup(root, gid, agentv1.FsGroupPolicy_FS_GROUP_POLICY_ALWAYS); err != nil {
		t.Fatal(err)
	}
	check(file, 0o660)
}

func TestParseMountinfo(t *testing.T) {
	e, ok := parseMountinfo(`36 35 254:0 / /mnt/my\040vol rw,noatime shared:1 master:2 - ext4 /dev/vda rw,errors=remount-ro`)
	if !ok || e.target != "/mnt/my vol" || e.fsType != "ext4" || e.source != "/dev/vda" {
		t.Fatalf("parse = %+v, %v", e, ok)
	}
	if _, ok := parseMountinfo("garbage line"); ok {
		t.Fatal("parsed garbage")
	}
}

func TestMountOptions(t *testing.T) {
	flags, data, err := mountOptions([]string{"noatime", "discard", "nodev", "dev", "", "errors=remount-ro"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if flags != unix.MS_NOATIME|unix.MS_RDONLY || data != "discard,errors=remount-ro" {
		t.Fatalf("flags %#x data %q", flags, data)
	}
	for _, bad := range []string{"bind", "a,b", "remount"} {
		if _, _, err := mountOptions([]string{bad}, false); err == nil {
			t.Errorf("option %q accepted", bad)
		}
	}
}

// testProcs is the test binary's one process table: its reaper collects every child of the process, as
// the agent's does as PID 1, so a second table (a test run twice) would take the first one's statuses.
var testProcs = sync.OnceValue(func() *procTable {
	p := newProcTable()
	go p.reap()
	return p
})

// The process table runs commands, reports status, output, truncation and
// timeouts, and reaps orphans without disturbing its own children.
func TestProcTableRun(t *testing.T) {
	p := testProcs()
	ctx := context.Background()

	res, err := p.run(ctx, []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, 5*time.Second)
	if err != nil || res.status != 3 || string(res.stdout) != "out\n" || string(res.stderr) != "err\n" {
		t.Fatalf("run = %+v, %v", res, err)
	}
	// A background child keeping stdout open does not hold the answer up.
	start := time.Now()
	res, err = p.run(ctx, []string{"sh", "-c", "sleep 5 & echo started"}, 5*time.Second)
	if err != nil || res.status != 0 || !strings.HasPrefix(string(res.stdout), "started") || time.Since(start) > 3*time.Second {
		t.Fatalf("run with a background child = %+v, %v after %s", res, err, time.Since(start))
	}
	res, err = p.run(ctx, []string{"sleep", "10"}, 100*time.Millisecond)
	if err != nil || !res.timedOut || res.status != 128+9 {
		t.Fatalf("timeout run = %+v, %v", res, err)
	}
	res, err = p.run(ctx, []string{"sh", "-c", "head -c 300000 /dev/zero"}, 5*time.Second)
	if err != nil || !res.truncated || len(res.stdout) != agentproto.MaxExecOutput {
		t.Fatalf("big output: truncated %v, %d bytes, %v", res.truncated, len(res.stdout), err)
	}
	if _, err := p.run(ctx, []string{"no-such-command-crust"}, time.Second); err == nil {
		t.Fatal("missing command started")
	}
}
