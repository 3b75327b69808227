//go:build linux

package guest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/microvm/agentproto"
)

func TestFindMountIn(t *testing.T) {
	const table = `22 1 0:21 / / rw - rootfs rootfs rw
36 22 254:0 / /mnt/my\040vol rw,noatime shared:1 master:2 - ext4 /dev/vda rw,errors=remount-ro
37 36 254:16 / /mnt/my\040vol rw - xfs /dev/vdb rw
`
	e, ok := findMountIn(strings.NewReader(table), "/mnt/my vol")
	if !ok || e.target != "/mnt/my vol" || e.fsType != "xfs" || e.source != "/dev/vdb" {
		t.Fatalf("findMountIn = %+v, %v; want the topmost mount, xfs on /dev/vdb", e, ok)
	}
	if e, ok := findMountIn(strings.NewReader(table), "/mnt"); ok {
		t.Fatalf("found %+v on a path nothing is mounted on", e)
	}
	if _, ok := findMountIn(strings.NewReader("garbage line\n"), "/mnt/my vol"); ok {
		t.Fatal("parsed garbage")
	}
}

// TestMountOptions: flags and data are split, and a read-only mount, asked as read_only or as "ro",
// replays no journal (noload for ext4, norecovery for xfs, once); a read-write one is left alone.
func TestMountOptions(t *testing.T) {
	flags, data, err := mountOptions([]string{"noatime", "discard", "nodev", "dev", "", "errors=remount-ro"}, true, "ext4")
	if err != nil {
		t.Fatal(err)
	}
	if flags != unix.MS_NOATIME|unix.MS_RDONLY || data != "discard,errors=remount-ro,noload" {
		t.Fatalf("flags %#x data %q", flags, data)
	}
	for _, c := range []struct {
		options  []string
		readOnly bool
		fsType   string
		want     string
	}{
		{[]string{"ro"}, false, "xfs", "norecovery"},
		{[]string{"norecovery"}, true, "xfs", "norecovery"},
		{nil, false, "ext4", ""},
		{[]string{"ro", "rw"}, false, "ext4", ""},
	} {
		if _, data, err := mountOptions(c.options, c.readOnly, c.fsType); err != nil || data != c.want {
			t.Errorf("%v read-only %t %s: data %q, %v; want %q", c.options, c.readOnly, c.fsType, data, err, c.want)
		}
	}
	for _, bad := range []string{"bind", "a,b", "remount"} {
		if _, _, err := mountOptions([]string{bad}, false, "ext4"); err == nil {
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

func TestDiskCandidates(t *testing.T) {
	disks := []string{"vda", "vdb", "vdc", "vdd"}
	held := map[string]string{"/dev/vda": "vol-a", "/dev/vdc": "vol-c", "/dev/vdz": "vol-z"}
	for _, tc := range []struct {
		name, serial string
		held         map[string]string
		all          bool
		want         string
	}{
		{"a new disk: the unheld ones only", "vol-new", held, false, "vdb vdd"},
		{"a held disk asked again: it after the unheld", "vol-c", held, false, "vdb vdd vdc"},
		{"the last look: every disk, held last", "vol-new", held, true, "vdb vdd vda vdc"},
		{"the last look for a held one: it before the other held", "vol-c", held, true, "vdb vdd vdc vda"},
		{"none held", "vol-new", nil, false, "vda vdb vdc vdd"},
	} {
		if got := strings.Join(diskCandidates(disks, tc.held, tc.serial, tc.all), " "); got != tc.want {
			t.Errorf("%s: diskCandidates = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestOfSubsystem(t *testing.T) {
	msg := func(fields ...string) []byte { return []byte(strings.Join(fields, "\x00") + "\x00") }
	for _, tc := range []struct {
		msg       []byte
		subsystem string
		want      bool
	}{
		{msg("add@/devices/pci0000:00/0000:00:02.0/0000:01:00.0/virtio3/block/vdb", "ACTION=add", "SUBSYSTEM=block", "DEVNAME=vdb"), "block", true},
		{msg("add@/devices/pci0000:00/0000:00:02.0/0000:01:00.0", "ACTION=add", "SUBSYSTEM=pci"), "block", false},
		{msg("change@/devices/virtio-ports/vport1p1", "ACTION=change", "SUBSYSTEM=virtio-ports"), "virtio-ports", true},
		{msg("add@/devices/x", "ACTION=add", "SUBSYSTEM=blocks"), "block", false},
		{msg("add@/devices/x", "DEVNAME=SUBSYSTEM=block"), "block", false},
		{nil, "block", false},
	} {
		if got := ofSubsystem(tc.msg, tc.subsystem); got != tc.want {
			t.Errorf("ofSubsystem(%q, %q) = %v, want %v", tc.msg, tc.subsystem, got, tc.want)
		}
	}
}
