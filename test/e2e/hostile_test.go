package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"

	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/harness"
)

// hostileCase is one hostile input: something planted on disk (optional) and a call over crustd's real
// socket (or a restart of crustd, or a call from another uid), with the answer the issue asks for.
type hostileCase struct {
	name string
	// plant changes the world before the call and returns how to undo it.
	plant func(t *testing.T) (undo func())
	// act makes the call; its error is a gRPC status error or nil.
	act func(t *testing.T) error
	// want is the code the issue asks for; codes.OK means served soundly (for a planted file crustd must
	// ignore or set aside), and act must then undo what it legitimately did.
	want codes.Code
	// ignore: snapshot lines holding one of these are not counted as changes (a planted entry that
	// crustd may move aside, as it must).
	ignore []string
	// alsoOK are other answers the issue allows (such as refusing to start instead of serving).
	alsoOK []codes.Code
}

// hostileTally is what the suite saw.
type hostileTally struct {
	tried, refused, changes, wrong int
	codes                          map[codes.Code]int
	failed                         []string
}

// TestHostileInputs starts the real crustd on real directories with real loop devices and throws every
// hostile input it can at it, over its unix socket, from another uid, and through its directories:
// malformed and oversized fields, non-UTF-8 bytes on the wire, path traversal, devices outside the
// allow-list and device nodes that lie about their number, forged pod uids, claims by other sandboxes,
// links, files, FIFOs and sockets planted in the Kata and state directories, huge files, hard links,
// and races on one target path. For each it counts what was tried, what was refused (by gRPC code), and
// whether anything changed in the state directory, the Kata directory, the targets of planted links or
// in what crustd lists (the goal is zero). It prints one summary line.
func TestHostileInputs(t *testing.T) {
	d := newDaemon(t, "--log-level", "debug") // every request is logged: secrets must still not be
	h := newHostileEnv(t, d)
	cases := h.cases()
	tally := hostileTally{codes: map[codes.Code]int{}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { h.run(t, c, &tally) })
	}
	h.stopD()
	var byCode []string
	for c, n := range tally.codes {
		byCode = append(byCode, fmt.Sprintf("%s=%d", c, n))
	}
	sort.Strings(byCode)
	t.Logf("hostile inputs: tried %d, refused %d, state changes %d, wrong answers %d (refusals by code: %s)",
		tally.tried, tally.refused, tally.changes, tally.wrong, strings.Join(byCode, " "))
	fmt.Printf("hostile inputs: tried %d, refused %d, state changes %d, wrong answers %d\n",
		tally.tried, tally.refused, tally.changes, tally.wrong)
	if len(tally.failed) > 0 {
		t.Logf("cases with a wrong answer or a change:\n  %s", strings.Join(tally.failed, "\n  "))
	}
}

// hostileEnv is crustd with a few volumes staged and claimed, and a bait directory that planted links
// point at.
type hostileEnv struct {
	d                *daemon
	vc               crustv1.VolumeServiceClient
	rc               crustv1.RuntimeServiceClient
	devA, devB, devC string // loop devices: A staged at tA (claimed) and tA2, B at tB, C free
	tA, tA2, tB      string
	newPod           string // a pod directory with nothing staged
	nonLoop          string // a block device of the host that is not a loop device (/dev/<name>)
	nonLoopDev       uint64
	devADev          uint64
	bait             string // <tmp>/bait: secret (0600), dir/
	seq              int
	endpointA        string // sb-a's handler
}

const (
	hostileSandbox = "sb-a"
	hostileSecret  = "s3cr3t-value-never-logged"
)

func newHostileEnv(t *testing.T, d *daemon) *hostileEnv {
	h := &hostileEnv{d: d, devA: loopDevice(t, 16<<20), devB: loopDevice(t, 16<<20), devC: loopDevice(t, 16<<20)}
	conn := d.conn()
	h.vc, h.rc = crustv1.NewVolumeServiceClient(conn), crustv1.NewRuntimeServiceClient(conn)
	h.tA = d.podTarget("a0000000-0000-4000-8000-000000000001", "pv-a")
	h.tA2 = d.podTarget("a0000000-0000-4000-8000-000000000002", "pv-a-again")
	h.tB = d.podTarget("b0000000-0000-4000-8000-000000000001", "pv-b")
	h.newPod = "c0000000-0000-4000-8000-000000000001"
	h.nonLoop, h.nonLoopDev = nonLoopDevice(t)
	h.bait = filepath.Join(t.TempDir(), "bait")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var st unix.Stat_t
	must(unix.Stat(h.devA, &st))
	h.devADev = st.Rdev
	must(os.MkdirAll(filepath.Join(h.bait, "dir"), 0o755))
	must(os.WriteFile(filepath.Join(h.bait, "secret"), []byte("nobody writes here\n"), 0o600))
	ctx := context.Background()
	for _, s := range []struct{ target, dev string }{{h.tA, h.devA}, {h.tA2, h.devA}, {h.tB, h.devB}} {
		_, err := h.vc.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
			VolumeTargetPath: s.target, VolumeBackingPath: s.dev, FsType: "ext4", VolumeId: filepath.Base(filepath.Dir(s.target)),
			Metadata: map[string]string{"encryptionKey": hostileSecret}}})
		must(err)
	}
	// sandbox sb-a's handler: alive (health), implementing nothing else
	hsock := filepath.Join(d.root, "handler-a.sock")
	testutil.ServeGRPC(t, hsock, func(srv *grpc.Server) {
		healthpb.RegisterHealthServer(srv, health.NewServer())
		crustv1.RegisterRuntimeHandlerServiceServer(srv, crustv1.UnimplementedRuntimeHandlerServiceServer{})
	})
	h.endpointA = "unix://" + hsock
	// sb-b's handler: gone, its socket left behind (crustd sees it; it refuses connections)
	must(listening(filepath.Join(d.root, "handler-b.sock")))
	_, err := h.rc.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: h.tA, SandboxId: hostileSandbox,
		HandlerEndpoint: h.endpointA})
	must(err)
	return h
}

// deadHandler claims tB for a sandbox whose handler endpoint nobody serves (a socket left by a handler that
// is gone: crustd sees it, and it refuses connections), makes call, and releases.
func (h *hostileEnv) deadHandler(call func(t *testing.T) error) func(t *testing.T) error {
	sock := filepath.Join(h.d.root, "nobody-serves.sock")
	claim := h.claimThen("sb-dead", "unix://"+sock, call)
	return func(t *testing.T) error {
		if _, err := os.Lstat(sock); err != nil {
			if err := listening(sock); err != nil {
				t.Fatal(err)
			}
		}
		return claim(t)
	}
}

// claimThen claims tB for sandbox with endpoint, makes call, and releases.
func (h *hostileEnv) claimThen(sandbox, endpoint string, call func(t *testing.T) error) func(t *testing.T) error {
	return func(t *testing.T) error {
		ctx, cancel := ctx5()
		defer cancel()
		if _, err := h.rc.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: h.tB, SandboxId: sandbox,
			HandlerEndpoint: endpoint}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = h.rc.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: h.tB, SandboxId: sandbox})
		}()
		return call(t)
	}
}

// stalledWatchers opens 100 watches that are never read, makes 1100 changes (more than a watcher may
// fall behind), and checks that calls are still answered (a stalled watcher is cut off, not waited for).
func (h *hostileEnv) stalledWatchers(t *testing.T) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 100 {
		if _, err := h.rc.WatchVolumes(ctx, &crustv1.WatchVolumesRequest{SendExisting: true}); err != nil {
			return err
		}
	}
	err := h.stageAndUndo(func(*crustv1.VolumeSpec) {})(t) // 2 changes per round
	for i := 0; err == nil && i < 549; i++ {
		err = h.stageAndUndo(func(*crustv1.VolumeSpec) {})(t)
	}
	if err != nil {
		return err
	}
	return h.listAll()
}

// idleConnections opens 1000 connections to crustd's socket that say nothing, and checks that a call is
// still answered.
func (h *hostileEnv) idleConnections(t *testing.T) error {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 1000 {
		c, err := net.Dial("unix", h.d.socket)
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns)+1, err)
		}
		conns = append(conns, c)
	}
	return h.listAll()
}

// nonLoopDevice returns a block device of this host that is not a loop device, with its number.
func nonLoopDevice(t *testing.T) (string, uint64) {
	t.Helper()
	ents, err := os.ReadDir("/sys/dev/block")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "7:") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/dev/block", e.Name(), "uevent"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			name, ok := strings.CutPrefix(l, "DEVNAME=")
			var st unix.Stat_t
			if ok && unix.Stat("/dev/"+name, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
				return "/dev/" + name, st.Rdev
			}
		}
	}
	t.Skip("no block device but loop devices here")
	return "", 0
}

// run runs one case and counts it.
func (h *hostileEnv) run(t *testing.T, c hostileCase, tally *hostileTally) {
	s0 := h.snapshot(t)
	undo := func() {}
	if c.plant != nil {
		undo = c.plant(t)
	}
	s1 := h.snapshot(t)
	err := c.act(t)
	s2 := h.snapshot(t)
	undo()
	if h.d.serving(time.Second) != nil { // a case that stopped crustd: bring it back for the next
		t.Logf("crustd is not serving after this case; its log:\n%s", h.d.Log())
		h.stopD()
		if err := h.startD(); err != nil {
			t.Fatalf("crustd does not start again once the plant is gone: %v", err)
		}
	}
	s3 := h.snapshot(t)

	h.restore(t)

	tally.tried++
	got := status.Code(err)
	if got != codes.OK {
		tally.refused++
		tally.codes[got]++
	}
	var problems []string
	if got != c.want && !slices.Contains(c.alsoOK, got) {
		tally.wrong++
		problems = append(problems, fmt.Sprintf("answered %s (%v), want %s", got, err, c.want))
	}
	if strings.Contains(h.d.Log(), hostileSecret) {
		problems = append(problems, "crustd's log holds the secret metadata value")
	}
	var diff []string
	if got != codes.OK {
		diff = append(diff, snapDiff(s1, s2, c.ignore)...) // a refusal changes nothing, even with the plant in place
	}
	diff = append(diff, snapDiff(s0, s3, c.ignore)...)
	if len(diff) > 0 {
		tally.changes++
		problems = append(problems, "changed: "+strings.Join(diff, "; "))
	}
	if len(problems) > 0 {
		tally.failed = append(tally.failed, c.name+": "+strings.Join(problems, "; "))
		t.Error(strings.Join(problems, "\n"))
	}
}

// restore brings the world back to the suite's baseline after a case that changed it, so that one
// case's damage is counted once: extra volumes are released and unstaged, tA is claimed by sb-a, tB by
// nobody, and the bait is made anew.
func (h *hostileEnv) restore(t *testing.T) {
	ctx, cancel := ctx5()
	defer cancel()
	r, err := h.vc.ListVolumes(ctx, &crustv1.ListVolumesRequest{})
	if err != nil || len(r.GetVolumes()) < 3 { // crustd lost volumes it has records of: read them again
		if err := h.restart(t); err != nil {
			t.Fatalf("restore: %v", err)
		}
		if r, err = h.vc.ListVolumes(ctx, &crustv1.ListVolumesRequest{}); err != nil {
			t.Fatalf("restore: %v", err)
		}
	}
	for _, v := range r.GetVolumes() {
		target := v.GetSpec().GetVolumeTargetPath()
		switch {
		case target == h.tA && v.GetClaim().GetSandboxId() == hostileSandbox:
		case target == h.tA || target == h.tA2 || target == h.tB:
			if v.GetClaim() != nil {
				_, _ = h.rc.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, Force: true})
			}
		default:
			_, _ = h.rc.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, Force: true})
			_, _ = h.vc.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target})
		}
	}
	if v, err := h.vc.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: h.tA}); err == nil && v.GetVolume().GetClaim() == nil {
		_, _ = h.rc.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: h.tA, SandboxId: hostileSandbox,
			HandlerEndpoint: h.endpointA})
	}
	_ = os.RemoveAll(h.bait)
	if err := os.MkdirAll(filepath.Join(h.bait, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.bait, "secret"), []byte("nobody writes here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// snapshot lists everything the suite watches: the state and Kata directories and the bait (type,
// mode, owner, size, content hash, link target), and what crustd lists.
func (h *hostileEnv) snapshot(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, root := range []string{h.d.state, h.d.kata, h.bait} {
		_ = filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %v", p, err))
				return nil
			}
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil {
				return nil
			}
			line := fmt.Sprintf("%s %o %d:%d", p, st.Mode, st.Uid, st.Gid)
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				// The lock holds the running crustd's pid, and the watch revision record what crustd keeps of its
				// revision counter, rewritten at every start.
				if p == filepath.Join(h.d.state, "lock") || p == filepath.Join(h.d.state, "watch", "revision.json") {
					break
				}
				line += fmt.Sprintf(" %d", st.Size)
				if st.Size < 1<<20 {
					b, _ := os.ReadFile(p)
					line += fmt.Sprintf(" %x", sha256.Sum256(b))
				}
			case unix.S_IFLNK:
				l, _ := os.Readlink(p)
				line += " -> " + l
			case unix.S_IFBLK, unix.S_IFCHR:
				line += fmt.Sprintf(" dev %d", st.Rdev)
			}
			out = append(out, line)
			return nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	token := ""
	for {
		r, err := h.vc.ListVolumes(ctx, &crustv1.ListVolumesRequest{StartingToken: token})
		if err != nil {
			out = append(out, "ListVolumes: "+status.Code(err).String())
			break
		}
		for _, v := range r.GetVolumes() {
			b, _ := protojson.Marshal(v)
			out = append(out, "volume "+string(b))
		}
		if token = r.GetNextToken(); token == "" {
			break
		}
	}
	sort.Strings(out)
	return out
}

// snapDiff lists what differs between two snapshots, leaving out lines that hold an ignore string, and
// what crustd lists when it did not answer in one of them (a crustd that refused to start).
func snapDiff(before, after, ignore []string) []string {
	down := func(snap []string) bool {
		return slices.ContainsFunc(snap, func(l string) bool { return strings.HasPrefix(l, "ListVolumes: ") })
	}
	listing := down(before) || down(after)
	skip := func(l string) bool {
		if listing && (strings.HasPrefix(l, "volume ") || strings.HasPrefix(l, "ListVolumes: ")) {
			return true
		}
		return slices.ContainsFunc(ignore, func(s string) bool { return strings.Contains(l, s) })
	}
	var diff []string
	for _, l := range before {
		if !slices.Contains(after, l) && !skip(l) {
			diff = append(diff, "gone: "+l)
		}
	}
	for _, l := range after {
		if !slices.Contains(before, l) && !skip(l) {
			diff = append(diff, "new: "+l)
		}
	}
	return diff
}

// target returns a new target path in a pod directory with nothing staged.
func (h *hostileEnv) target() string {
	h.seq++
	return h.d.podTarget(h.newPod, fmt.Sprintf("pv-new-%d", h.seq))
}

// good is a spec crustd accepts, for a new target and the free device.
func (h *hostileEnv) good() *crustv1.VolumeSpec {
	return &crustv1.VolumeSpec{VolumeTargetPath: h.target(), VolumeBackingPath: h.devC, FsType: "ext4", VolumeId: "v-new"}
}

func ctx5() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// rpc makes one call with a timeout.
func rpc(timeout time.Duration, call func(ctx context.Context) error) func(*testing.T) error {
	return func(*testing.T) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return call(ctx)
	}
}

// stage sends StageVolume with the good spec changed by mut.
func (h *hostileEnv) stage(mut func(s *crustv1.VolumeSpec)) func(t *testing.T) error {
	return h.stageThen(mut, false)
}

// stageAndUndo stages the good spec (changed by mut) and, when crustd accepts it, unstages it again, so
// that a case whose right answer is OK leaves nothing behind.
func (h *hostileEnv) stageAndUndo(mut func(s *crustv1.VolumeSpec)) func(t *testing.T) error {
	return h.stageThen(mut, true)
}

func (h *hostileEnv) stageThen(mut func(s *crustv1.VolumeSpec), unstage bool) func(t *testing.T) error {
	return rpc(5*time.Second, func(ctx context.Context) error {
		s := h.good()
		mut(s)
		_, err := h.vc.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: s})
		if err == nil && unstage {
			_, err = h.vc.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: s.GetVolumeTargetPath()})
		}
		return err
	})
}

// plantAt makes something at path p (made by mk) and removes it (with anything under it) on undo.
func plantAt(p string, mk func(p string) error) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := mk(p); err != nil {
			t.Fatalf("plant %s: %v", p, err)
		}
		return func() { _ = os.RemoveAll(p) }
	}
}

func symlinkTo(target string) func(p string) error {
	return func(p string) error { return os.Symlink(target, p) }
}
func fifo(p string) error    { return unix.Mkfifo(p, 0o600) }
func regular(p string) error { return os.WriteFile(p, []byte("planted\n"), 0o644) }
func directory(p string) error {
	return os.Mkdir(p, 0o755)
}
func blockNode(dev uint64) func(p string) error {
	return func(p string) error { return unix.Mknod(p, unix.S_IFBLK|0o600, int(dev)) }
}
func charNode(dev uint64) func(p string) error {
	return func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o600, int(dev)) }
}

// listening makes a unix socket at p (a long p is bound beside it under a short name and moved there:
// a socket address holds 107 bytes).
func listening(p string) error {
	if len(p) < 100 {
		l, err := net.Listen("unix", p)
		if err != nil {
			return err
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		return l.Close()
	}
	dir, err := os.MkdirTemp(filepath.Dir(filepath.Dir(p)), "s")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		return err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		return err
	}
	return os.Rename(filepath.Join(dir, "s"), p)
}

// rawStage sends StageVolume as bytes built by hand, so that it can hold what generated code refuses to
// marshal (strings that are not UTF-8).
func (h *hostileEnv) rawStage(target, backing []byte) func(t *testing.T) error {
	return func(*testing.T) error {
		var spec []byte
		spec = protowire.AppendTag(spec, 1, protowire.BytesType)
		spec = protowire.AppendBytes(spec, target)
		spec = protowire.AppendTag(spec, 2, protowire.BytesType)
		spec = protowire.AppendBytes(spec, backing)
		spec = protowire.AppendTag(spec, 4, protowire.BytesType)
		spec = protowire.AppendString(spec, "ext4")
		var req []byte
		req = protowire.AppendTag(req, 1, protowire.BytesType)
		req = protowire.AppendBytes(req, spec)
		var resp []byte
		ctx, cancel := ctx5()
		defer cancel()
		return h.d.conn().Invoke(ctx, "/crust.v1.VolumeService/StageVolume", &req, &resp, grpc.ForceCodec(rawCodec{}))
	}
}

// rawCodec sends and receives message bytes as they are.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	return *(v.(*[]byte)), nil
}
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

// asOtherUser runs crustctl as uid/gid 1000 with args and returns the gRPC code it reports.
func (h *hostileEnv) asOtherUser(args ...string) func(t *testing.T) error {
	return func(t *testing.T) error {
		_, errOut, code := runAs(t, &syscall.Credential{Uid: 1000, Gid: 1000}, filepath.Join(binDir, "crustctl"),
			append([]string{"--socket", h.d.socket}, args...)...)
		if code == 0 {
			return nil
		}
		return ctlError(errOut)
	}
}

// ctlError turns crustctl's "crustctl: CODE: message" into a status error.
func ctlError(stderr string) error {
	rest, _ := strings.CutPrefix(strings.TrimSpace(stderr), "crustctl: ")
	name, msg, _ := strings.Cut(rest, ": ")
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return status.Error(c, msg)
		}
	}
	return status.Error(codes.Unknown, stderr)
}

// startD starts crustd and waits until it serves, with a new connection (the old one may be backing off
// after the outage); an error when it exits (Unavailable) or does not serve in 20 s (DeadlineExceeded).
func (h *hostileEnv) startD() error {
	h.d.ReadyTimeout = 20 * time.Second
	if err := h.d.Start(); err != nil {
		if errors.Is(err, harness.ErrExited) {
			return status.Error(codes.Unavailable, err.Error())
		}
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	conn := h.d.conn()
	h.vc, h.rc = crustv1.NewVolumeServiceClient(conn), crustv1.NewRuntimeServiceClient(conn)
	return nil
}

// stopD stops crustd with SIGTERM (SIGKILL after 20 s).
func (h *hostileEnv) stopD() { h.d.Stop() }

// restart stops crustd and starts it again; an error when it does not come up serving.
func (h *hostileEnv) restart(*testing.T) error {
	h.stopD()
	return h.startD()
}

// restartAndList restarts crustd and lists the volumes; an error unless all three staged volumes are
// still there.
func (h *hostileEnv) restartAndList(t *testing.T) error {
	if err := h.restart(t); err != nil {
		return err
	}
	return h.listAll()
}

// listAll lists every volume; an error unless the three staged ones are there.
func (h *hostileEnv) listAll() error {
	ctx, cancel := ctx5()
	defer cancel()
	r, err := h.vc.ListVolumes(ctx, &crustv1.ListVolumesRequest{})
	if err != nil {
		return err
	}
	if n := len(r.GetVolumes()); n != 3 {
		return status.Errorf(codes.DataLoss, "%d volumes listed, want 3", n)
	}
	return nil
}

func (h *hostileEnv) kataDir(target string) string {
	return filepath.Join(h.d.kata, kata.VolumeDirName(target))
}

func (h *hostileEnv) cases() []hostileCase {
	var cs []hostileCase
	add := func(c ...hostileCase) { cs = append(cs, c...) }
	inv := codes.InvalidArgument
	kubelet := h.d.kubelet
	stageField := func(name string, mut func(s *crustv1.VolumeSpec)) hostileCase {
		return hostileCase{name: "stage: " + name, act: h.stage(mut), want: inv}
	}
	long := func(n int) string { return strings.Repeat("x", n) }

	// ---- StageVolume fields: malformed, oversized, traversal
	for name, target := range map[string]string{
		"empty": "", "relative": "pods/x/volumes/v/mount", "trailing slash": kubelet + "/pods/x/mount/",
		"double slash": kubelet + "//pods/x/mount", "dot": kubelet + "/pods/./x/mount",
		"dot-dot inside": kubelet + "/pods/x/../y/mount", "dot-dot out": kubelet + "/pods/../../../etc/cron.d/x",
		"outside the kubelet root": "/etc/crust-evil", "the kubelet root": kubelet, "a sibling of the root": kubelet + "x/pods/y",
		"NUL": kubelet + "/pods/x\x00/mount", "newline": kubelet + "/pods/x\n/mount", "escape sequence": kubelet + "/pods/\x1b[2J",
		"8 KiB long": kubelet + "/" + strings.Repeat("abcdefg/", 1024), "component of 300 bytes": kubelet + "/pods/" + long(300),
	} {
		add(stageField("target "+name, func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = target }))
	}
	for name, backing := range map[string]string{
		"empty": "", "relative": "dev/loop0", "missing": "/dev/loop-crust-missing", "a glob": "/dev/loop*",
		"NUL": h.devC + "\x00", "a char device": "/dev/null", "a device outside the allow-list": h.nonLoop,
		"dot-dot out of the allow-list": h.devC + "/../" + filepath.Base(h.nonLoop), "a directory": "/dev",
		"8 KiB long": "/dev/" + strings.Repeat("loop/../", 1024) + "loop0",
	} {
		add(stageField("backing "+name, func(s *crustv1.VolumeSpec) { s.VolumeBackingPath = backing }))
	}
	add(
		hostileCase{name: "stage: no spec", want: inv, act: func(*testing.T) error {
			ctx, cancel := ctx5()
			defer cancel()
			_, err := h.vc.StageVolume(ctx, &crustv1.StageVolumeRequest{})
			return err
		}},
		stageField("an empty spec", func(s *crustv1.VolumeSpec) { *s = crustv1.VolumeSpec{} }),
		stageField("volume type 99", func(s *crustv1.VolumeSpec) { s.VolumeType = 99 }),
		stageField("image file not allowed", func(s *crustv1.VolumeSpec) {
			s.VolumeType, s.VolumeBackingPath = crustv1.VolumeType_VOLUME_TYPE_FILE, filepath.Join(h.bait, "secret")
		}),
		stageField("fs type empty", func(s *crustv1.VolumeSpec) { s.FsType = "" }),
		stageField("fs type vfat", func(s *crustv1.VolumeSpec) { s.FsType = "vfat" }),
		stageField("fs type with options", func(s *crustv1.VolumeSpec) { s.FsType = "ext4,dev" }),
		stageField("fs type 1 KiB", func(s *crustv1.VolumeSpec) { s.FsType = long(1024) }),
		stageField("volume mode 3", func(s *crustv1.VolumeSpec) { s.VolumeMode = 3 }),
		stageField("raw block with an fs type", func(s *crustv1.VolumeSpec) { s.VolumeMode = crustv1.VolumeMode_VOLUME_MODE_BLOCK }),
		stageField("raw block with mount flags", func(s *crustv1.VolumeSpec) {
			s.VolumeMode, s.FsType, s.MountFlags = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", []string{"dev"}
		}),
		stageField("raw block formatted", func(s *crustv1.VolumeSpec) {
			s.VolumeMode, s.FsType, s.CreateFilesystem = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", true
		}),
		stageField("raw block with a group", func(s *crustv1.VolumeSpec) {
			gid := int64(0)
			s.VolumeMode, s.FsType, s.VolumeSupplementalGroup = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", &gid
		}),
		stageField("raw block of a pmem volume", func(s *crustv1.VolumeSpec) {
			s.VolumeMode, s.FsType, s.VolumeType = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", crustv1.VolumeType_VOLUME_TYPE_PMEM
		}),
	)
	for _, flags := range [][]string{
		{"bind"}, {"rbind"}, {"remount"}, {"move"}, {"make-shared"}, {"rshared"}, {"dev"}, {"suid"}, {"SUID"},
		{"noatime,dev"}, {""}, {"no atime"}, {"x\x00y"}, {long(300)}, {"ro"}, {"noatime", "noatime"},
		slices.Repeat([]string{"noatime"}, 40), {"context=é"},
	} {
		add(stageField(fmt.Sprintf("mount flags %q", flags), func(s *crustv1.VolumeSpec) { s.MountFlags = flags }))
	}
	many := map[string]string{}
	for i := range 17 {
		many[fmt.Sprintf("csi.storage.k8s.io/k%d", i)] = "v"
	}
	for name, md := range map[string]map[string]string{
		"17 pairs": many, "an unknown key": {"example.com/evil": "1"}, "a key of 300 bytes": {long(300): "v"},
		"a value of 8 KiB":      {"csi.storage.k8s.io/pod.name": long(8192)},
		"the typed key fsGroup": {"fsGroup": "0"}, "createFilesystem not a boolean": {"createFilesystem": "yes"},
		"a forged pod.uid": {"csi.storage.k8s.io/pod.uid": "a0000000-0000-4000-8000-000000000001"},
		"an empty key":     {"": "v"},
	} {
		add(stageField("metadata "+name, func(s *crustv1.VolumeSpec) { s.Metadata = md }))
	}
	neg, huge := int64(-1), int64(1)<<40
	add(
		stageField("pod_uid of another pod", func(s *crustv1.VolumeSpec) { s.PodUid = "a0000000-0000-4000-8000-000000000001" }),
		stageField("pod_uid of 100 bytes", func(s *crustv1.VolumeSpec) { s.PodUid = long(100) }),
		stageField("fsGroup -1", func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = &neg }),
		stageField("fsGroup 2^40", func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = &huge }),
		stageField("fsGroup policy without a group", func(s *crustv1.VolumeSpec) {
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS
		}),
		stageField("fsGroup policy 7", func(s *crustv1.VolumeSpec) { s.SupplementalGroupChangePolicy = 7 }),
		stageField("volume id of 300 bytes", func(s *crustv1.VolumeSpec) { s.VolumeId = long(300) }),
		stageField("volume id with a newline", func(s *crustv1.VolumeSpec) { s.VolumeId = "v\n1" }),
		stageField("csi driver not a DNS name", func(s *crustv1.VolumeSpec) { s.CsiDriver = "Not_A_Driver!" }),
		hostileCase{name: "stage: a 5 MiB request", act: h.stage(func(s *crustv1.VolumeSpec) {
			s.Metadata = map[string]string{"csi.storage.k8s.io/pod.name": long(5 << 20)}
		}), want: codes.ResourceExhausted},
		hostileCase{name: "stage: the same target with another device", act: h.stage(func(s *crustv1.VolumeSpec) {
			s.VolumeTargetPath = h.tB
		}), want: codes.AlreadyExists},
		hostileCase{name: "stage: target not UTF-8 (raw bytes on the wire)", want: inv,
			act: h.rawStage([]byte(kubelet+"/pods/"+h.newPod+"/volumes/kubernetes.io~csi/x\xff\xfe/mount"), []byte(h.devC))},
		hostileCase{name: "stage: backing path not UTF-8 (raw bytes on the wire)", want: inv,
			act: h.rawStage([]byte(h.target()), []byte("/dev/loop\xff"))},
		hostileCase{name: "stage: not a protobuf message (raw bytes on the wire)", want: inv,
			act: func(*testing.T) error {
				req, resp := []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, []byte(nil)
				ctx, cancel := ctx5()
				defer cancel()
				return h.d.conn().Invoke(ctx, "/crust.v1.VolumeService/StageVolume", &req, &resp, grpc.ForceCodec(rawCodec{}))
			}},
	)

	// ---- device nodes that lie about what they are (planted in /dev, matching --device-allow /dev/loop*)
	liar := fmt.Sprintf("/dev/loop%d", 900000+os.Getpid()%90000)
	withLiar := func(name string, mk func(p string) error) hostileCase {
		return hostileCase{name: "device: " + name, plant: plantAt(liar, mk), want: inv,
			act: h.stage(func(s *crustv1.VolumeSpec) { s.VolumeBackingPath = liar })}
	}
	add(
		withLiar("a loop-named node with the host disk's number", blockNode(h.nonLoopDev)),
		withLiar("a loop-named node with a staged loop's number", blockNode(h.devADev)),
		withLiar("a loop-named node with a number no device has", blockNode(unix.Mkdev(7, 1<<20-3))),
		withLiar("a loop-named char device", charNode(unix.Mkdev(1, 3))),
		withLiar("a loop-named FIFO", fifo),
		withLiar("a loop-named socket", listening),
		withLiar("a loop-named regular file", regular),
		withLiar("a loop-named directory", directory),
		withLiar("a loop-named symlink to the host disk", symlinkTo(h.nonLoop)),
		withLiar("a loop-named dangling symlink", symlinkTo("/dev/loop-crust-nothing")),
		withLiar("a loop-named symlink loop", symlinkTo(liar)),
	)

	// ---- target paths through things planted in the kubelet directory
	podDir := filepath.Join(kubelet, "pods", h.newPod, "volumes", "kubernetes.io~csi")
	add(
		hostileCase{name: "kubelet: target through a symlink to the bait", want: inv,
			plant: plantAt(filepath.Join(podDir, "evil"), symlinkTo(h.bait)),
			act:   h.stage(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = filepath.Join(podDir, "evil", "dir", "mount") })},
		hostileCase{name: "kubelet: target is a symlink", want: inv,
			plant: plantAt(filepath.Join(podDir, "evil2"), symlinkTo(h.bait)),
			act:   h.stage(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = filepath.Join(podDir, "evil2") })},
		hostileCase{name: "kubelet: target through a regular file", want: inv,
			plant: plantAt(filepath.Join(podDir, "file"), regular),
			act:   h.stage(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = filepath.Join(podDir, "file", "mount") })},
		hostileCase{name: "kubelet: target through a FIFO", want: inv,
			plant: plantAt(filepath.Join(podDir, "fifo"), fifo),
			act:   h.stage(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = filepath.Join(podDir, "fifo", "mount") })},
	)

	// ---- the other calls
	const slow = 20 * time.Second // for calls crustd forwards to a handler
	unstage := func(target string) func(*testing.T) error {
		return rpc(5*time.Second, func(ctx context.Context) error {
			_, err := h.vc.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target})
			return err
		})
	}
	get := func(target string) func(*testing.T) error {
		return rpc(5*time.Second, func(ctx context.Context) error {
			_, err := h.vc.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
			return err
		})
	}
	stats := func(target string) func(*testing.T) error {
		return rpc(slow, func(ctx context.Context) error {
			_, err := h.vc.GetVolumeStats(ctx, &crustv1.GetVolumeStatsRequest{VolumeTargetPath: target})
			return err
		})
	}
	expand := func(target string, req, limit int64) func(*testing.T) error {
		return rpc(slow, func(ctx context.Context) error {
			_, err := h.vc.ExpandVolume(ctx, &crustv1.ExpandVolumeRequest{VolumeTargetPath: target, RequiredBytes: req, LimitBytes: limit})
			return err
		})
	}
	list := func(maxEntries int32, token string) func(*testing.T) error {
		return rpc(5*time.Second, func(ctx context.Context) error {
			_, err := h.vc.ListVolumes(ctx, &crustv1.ListVolumesRequest{MaxEntries: maxEntries, StartingToken: token})
			return err
		})
	}
	claim := func(target, sandbox, endpoint string) func(*testing.T) error {
		return rpc(5*time.Second, func(ctx context.Context) error {
			_, err := h.rc.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: target, SandboxId: sandbox, HandlerEndpoint: endpoint})
			return err
		})
	}
	release := func(target, sandbox string) func(*testing.T) error {
		return rpc(5*time.Second, func(ctx context.Context) error {
			_, err := h.rc.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, SandboxId: sandbox})
			return err
		})
	}
	ep := "unix://" + filepath.Join(h.d.root, "handler-b.sock")
	for name, target := range map[string]string{"empty": "", "relative": "pods/x", "dot-dot": kubelet + "/pods/../../etc",
		"outside": "/etc/passwd", "NUL": h.tB + "\x00"} {
		add(
			hostileCase{name: "unstage: target " + name, act: unstage(target), want: inv},
			hostileCase{name: "get: target " + name, act: get(target), want: inv},
			hostileCase{name: "stats: target " + name, act: stats(target), want: inv},
			hostileCase{name: "expand: target " + name, act: expand(target, 32<<20, 0), want: inv},
			hostileCase{name: "claim: target " + name, act: claim(target, "sb-b", ep), want: inv},
		)
	}
	for name, sb := range map[string]string{"empty": "", "dot-dot": "..", "with a slash": "a/b", "200 bytes": long(200),
		"with NUL": "sb\x00", "with a newline": "sb\n", "a dot": "."} {
		add(hostileCase{name: "claim: sandbox id " + name, act: claim(h.tB, sb, ep), want: inv})
	}
	for name, e := range map[string]string{"tcp": "tcp://127.0.0.1:1", "http": "http://127.0.0.1:1/x",
		"relative unix path": "unix://run/h.sock", "unix path of 200 bytes": "unix:///" + long(200), "empty path": "unix://",
		"NUL": "unix:///run/h\x00.sock"} {
		add(hostileCase{name: "claim: endpoint " + name, act: claim(h.tB, "sb-b", e), want: inv})
	}
	add(
		hostileCase{name: "get: unknown target", act: get(h.target()), want: codes.NotFound},
		hostileCase{name: "stats: unknown target", act: stats(h.target()), want: codes.NotFound},
		hostileCase{name: "expand: unknown target", act: expand(h.target(), 32<<20, 0), want: codes.NotFound},
		hostileCase{name: "expand: negative size", act: expand(h.tA, -1, 0), want: inv},
		hostileCase{name: "expand: limit below required", act: expand(h.tA, 64<<20, 32<<20), want: inv},
		hostileCase{name: "expand: a dead handler's volume", act: h.deadHandler(expand(h.tB, 16<<20, 0)), want: codes.Unavailable},
		hostileCase{name: "stats: a dead handler's volume", act: h.deadHandler(stats(h.tB)), want: codes.Unavailable},
		hostileCase{name: "list: max_entries -1", act: list(-1, ""), want: inv},
		hostileCase{name: "list: forged token", act: list(0, "AAAA-not-a-token"), want: inv},
		hostileCase{name: "list: token of 1 MiB", act: list(0, long(1<<20)), want: codes.ResourceExhausted},
		hostileCase{name: "claim: another sandbox's volume", act: claim(h.tA, "sb-b", ep), want: codes.FailedPrecondition},
		hostileCase{name: "claim: the device another sandbox holds, through another path", act: claim(h.tA2, "sb-b", ep),
			want: codes.FailedPrecondition},
		hostileCase{name: "claim: unknown target", act: claim(h.target(), "sb-b", ep), want: codes.NotFound},
		hostileCase{name: "claim: an endpoint whose socket crustd cannot see", want: codes.FailedPrecondition,
			act: claim(h.tB, "sb-b", "unix://"+filepath.Join(h.d.root, "nowhere", "h.sock"))},
		hostileCase{name: "claim: an endpoint that is not a socket", want: codes.FailedPrecondition,
			act: claim(h.tB, "sb-b", "unix://"+filepath.Join(h.bait, "secret"))},
		hostileCase{name: "release: another sandbox's claim", act: release(h.tA, "sb-b"), want: codes.FailedPrecondition},
		hostileCase{name: "release: no sandbox and no force", act: release(h.tA, ""), want: inv},
	)

	// ---- callers of another uid (the peer-credential check), with the socket opened wide by mistake
	widen := func(t *testing.T) func() {
		for _, p := range []string{filepath.Dir(h.d.root), h.d.root, filepath.Dir(h.d.socket)} {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(h.d.socket, 0o666); err != nil {
			t.Fatal(err)
		}
		return func() { _ = os.Chmod(h.d.socket, 0o600) }
	}
	for name, args := range map[string][]string{
		"ls": {"ls"}, "get": {"get", h.tA},
		"stage":   {"stage", "--target-path", h.target(), "--device", h.devC, "--fs-type", "ext4"},
		"unstage": {"unstage", "--target-path", h.tB}, "claim": {"claim", h.tB, "--sandbox-id", "sb-evil"},
		"release --force": {"release", h.tA, "--force"}, "stats": {"stats", h.tA}, "expand": {"expand", h.tA, "--size", "33554432"},
		"watch": {"watch"},
	} {
		add(hostileCase{name: "uid 1000: " + name, plant: widen, act: h.asOtherUser(args...), want: codes.PermissionDenied})
	}
	add(hostileCase{name: "crustctl: target not UTF-8", want: inv, act: func(*testing.T) error {
		_, errOut, code := h.d.crustctl("stage", "--target-path", kubelet+"/pods/x/\xff/mount", "--device", h.devC, "--fs-type", "ext4")
		if code == 0 {
			return nil
		}
		if code == 2 && strings.Contains(errOut, "--target-path is not valid UTF-8") {
			return status.Error(codes.InvalidArgument, errOut) // refused before it was sent, naming the argument
		}
		return ctlError(errOut)
	}})

	// ---- things planted in the Kata directory
	// atNew plants mk's thing at the Kata directory of a new target and stages that target (unstaging it
	// again when that succeeds: then nothing may have been written through the plant).
	atNew := func(name string, want codes.Code, mk func(p string) error, alsoOK ...codes.Code) hostileCase {
		target := h.target()
		return hostileCase{name: "kata: " + name, want: want, alsoOK: alsoOK,
			plant: plantAt(h.kataDir(target), mk),
			act:   h.stageAndUndo(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = target })}
	}
	// Replacing a planted entry (rename over it) writes nothing through it, so OK is as good as a refusal
	// there; a planted directory must be refused or replaced, never written into.
	replaced := []codes.Code{codes.OK}
	dirWith := func(mk func(p string) error) func(p string) error {
		return func(p string) error {
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			return mk(filepath.Join(p, kata.MountInfoFileName))
		}
	}
	hardTarget := h.target()
	add(
		atNew("a symlink at a new volume's directory", codes.FailedPrecondition,
			symlinkTo(filepath.Join(h.bait, "dir")), replaced...),
		atNew("a symlink at a new volume's mountInfo.json", codes.FailedPrecondition,
			dirWith(symlinkTo(filepath.Join(h.bait, "secret"))), replaced...),
		atNew("a regular file at a new volume's directory", codes.FailedPrecondition, regular),
		atNew("a FIFO at a new volume's directory", codes.FailedPrecondition, fifo),
		atNew("a FIFO at a new volume's mountInfo.json", codes.FailedPrecondition, dirWith(fifo), replaced...),
		atNew("a socket at a new volume's mountInfo.json", codes.FailedPrecondition, dirWith(listening), replaced...),
		atNew("a directory at a new volume's mountInfo.json",
			codes.FailedPrecondition, dirWith(directory)),
		hostileCase{name: "kata: a hard link to the bait at a new volume's mountInfo.json", want: codes.OK,
			plant: plantAt(h.kataDir(hardTarget), dirWith(func(p string) error { return os.Link(filepath.Join(h.bait, "secret"), p) })),
			act: func(t *testing.T) error {
				before, _ := os.ReadFile(filepath.Join(h.bait, "secret"))
				err := h.stageAndUndo(func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = hardTarget })(t)
				if after, _ := os.ReadFile(filepath.Join(h.bait, "secret")); !bytes.Equal(before, after) {
					return status.Errorf(codes.DataLoss, "wrote through a hard link: the bait now holds %q", after)
				}
				return err
			}},
		hostileCase{name: "kata: a non-UTF-8 sandbox-id file name, then list", want: codes.OK,
			plant: plantAt(filepath.Join(h.kataDir(h.tB), "sb-\xff\xfe"), regular), act: func(*testing.T) error { return h.listAll() },
			ignore: []string{"sb-\xff\xfe"}},
		hostileCase{name: "kata: a sandbox-id symlink to the bait, then list", want: codes.OK,
			plant: plantAt(filepath.Join(h.kataDir(h.tB), "sb-link"), symlinkTo(filepath.Join(h.bait, "secret"))),
			act:   func(*testing.T) error { return h.listAll() }, ignore: []string{"sb-link"}},
		hostileCase{name: "kata: a FIFO as a sandbox-id file, then list", want: codes.OK,
			plant: plantAt(filepath.Join(h.kataDir(h.tB), "sb-fifo"), fifo),
			act:   func(*testing.T) error { return h.listAll() }, ignore: []string{"sb-fifo"}},
		hostileCase{name: "kata: a 1 GiB sparse mountInfo.json of a staged volume, then restart", want: codes.OK,
			plant: func(t *testing.T) func() {
				p := filepath.Join(h.kataDir(h.tB), kata.MountInfoFileName)
				saved, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(p, 1<<30); err != nil {
					t.Fatal(err)
				}
				return func() {
					if fi, err := os.Stat(p); err == nil && fi.Size() == 1<<30 { // crustd left it: put it back
						_ = os.WriteFile(p, saved, 0o600)
					}
				}
			}, act: h.restartAndList},
		hostileCase{name: "kata: a regular file where a staged volume's directory is, then restart",
			want: codes.OK, plant: h.replaceWith(h.kataDir(h.tB), regular), act: h.restartAndList},
		hostileCase{name: "kata: a symlink where a staged volume's directory is, then restart",
			want: codes.OK, plant: h.replaceWith(h.kataDir(h.tB), symlinkTo(filepath.Join(h.bait, "dir"))), act: h.restartAndList},
		hostileCase{name: "kata: a stray directory with a 255-byte name, then restart", want: codes.OK,
			plant: plantAt(filepath.Join(h.d.kata, long(255)), directory), act: h.restartAndList, ignore: []string{long(255)}},
		hostileCase{name: "kata: a symlink at the projection's temporary directory, then stage", want: codes.OK,
			plant: h.replaceWith(filepath.Join(h.d.kata, ".crust-tmp"), symlinkTo(filepath.Join(h.bait, "dir"))),
			act:   h.stageAndUndo(func(*crustv1.VolumeSpec) {})},
	)

	// ---- things planted in the state directory
	add(
		hostileCase{name: "state: a symlink at tmp/, then restart", want: codes.OK, alsoOK: []codes.Code{codes.Unavailable},
			plant: h.replaceWith(filepath.Join(h.d.state, "tmp"), symlinkTo(filepath.Join(h.bait, "dir"))), act: h.restartAndList},
		hostileCase{name: "state: a symlink at tmp/, then stage", want: codes.OK,
			plant: h.replaceWith(filepath.Join(h.d.state, "tmp"), symlinkTo(filepath.Join(h.bait, "dir"))),
			act:   h.stageAndUndo(func(*crustv1.VolumeSpec) {})},
		hostileCase{name: "state: a symlink at volumes/, then restart", want: codes.Unavailable,
			plant: h.replaceWith(filepath.Join(h.d.state, "volumes"), symlinkTo(filepath.Join(h.bait, "dir"))),
			act:   h.restartAndList},
		hostileCase{name: "state: a record that is a symlink to the bait, then restart", want: codes.OK,
			plant: plantAt(filepath.Join(h.d.state, "volumes", strings.Repeat("e", 64)+".json"), symlinkTo(filepath.Join(h.bait, "secret"))),
			act:   h.restartAndList, ignore: []string{strings.Repeat("e", 64)}},
		hostileCase{name: "state: a record that is a FIFO, then restart", want: codes.OK,
			plant: plantAt(filepath.Join(h.d.state, "volumes", strings.Repeat("f", 64)+".json"), fifo),
			act:   h.restartAndList, ignore: []string{strings.Repeat("f", 64)}},
		hostileCase{name: "state: a 1 GiB sparse record, then restart", want: codes.OK,
			plant: plantAt(filepath.Join(h.d.state, "volumes", strings.Repeat("d", 64)+".json"), func(p string) error {
				if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
					return err
				}
				return os.Truncate(p, 1<<30)
			}),
			act: h.restartAndList, ignore: []string{strings.Repeat("d", 64)}},
		hostileCase{name: "state: a regular file at tmp/, then restart", want: codes.OK, alsoOK: []codes.Code{codes.Unavailable},
			plant: h.replaceWith(filepath.Join(h.d.state, "tmp"), regular), act: h.restartAndList},
		hostileCase{name: "state: a symlink at corrupt/ and a damaged record, then restart", want: codes.OK, alsoOK: []codes.Code{codes.Unavailable},
			plant: func(t *testing.T) func() {
				undo1 := h.replaceWith(filepath.Join(h.d.state, "corrupt"), symlinkTo(filepath.Join(h.bait, "dir")))(t)
				undo2 := plantAt(filepath.Join(h.d.state, "volumes", strings.Repeat("c", 64)+".json"), regular)(t)
				return func() { undo2(); undo1() }
			}, act: h.restartAndList, ignore: []string{strings.Repeat("c", 64)}},
	)

	// ---- resource abuse
	add(
		hostileCase{name: "claim: sandbox id mountInfo.json", act: claim(h.tB, "mountInfo.json", ep), want: inv},
		hostileCase{name: "expand: required bytes 2^63-1", act: expand(h.tA, 1<<63-1, 0), want: codes.FailedPrecondition},
		hostileCase{name: "stats: a handler endpoint that is crustd's own socket", want: codes.Unimplemented,
			act: h.claimThen("sb-self", "unix://"+h.d.socket, stats(h.tB))},
		hostileCase{name: "secret metadata in a refused request is not logged", want: inv, act: h.stage(func(s *crustv1.VolumeSpec) {
			s.Metadata = map[string]string{"encryptionKey": hostileSecret, "example.com/unknown": "x"}
		})},
		hostileCase{name: "watch: 100 watchers that never read while 1100 changes happen", want: codes.OK, act: h.stalledWatchers},
		hostileCase{name: "connections: 1000 held open without a word, then a call", want: codes.OK, act: h.idleConnections},
	)

	// ---- races on one target path
	add(
		hostileCase{name: "race: 8 callers stage and unstage one path 25 times each", want: codes.OK, act: h.race(false)},
		hostileCase{name: "race: stage, claim, release and unstage of one path at once", want: codes.OK, act: h.race(true)},
	)
	return cs
}

// replaceWith moves what is at p aside and plants mk's thing there; undo puts the original back
// (removing what crustd may have made meanwhile).
func (h *hostileEnv) replaceWith(p string, mk func(p string) error) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		aside := p + ".hostile-aside"
		if err := os.Rename(p, aside); err != nil {
			t.Fatal(err)
		}
		if err := mk(p); err != nil {
			t.Fatal(err)
		}
		return func() {
			_ = os.RemoveAll(p)
			if err := os.Rename(aside, p); err != nil {
				t.Errorf("put %s back: %v", p, err)
			}
		}
	}
}

// race runs callers that stage and unstage (and, with claims, claim and release) one target path at
// once; every answer must be OK, ABORTED (another call in flight) or FAILED_PRECONDITION (claimed or
// not staged at that instant), and after a last unstage nothing may remain.
func (h *hostileEnv) race(claims bool) func(t *testing.T) error {
	return func(*testing.T) error {
		target := h.target()
		spec := &crustv1.VolumeSpec{VolumeTargetPath: target, VolumeBackingPath: h.devC, FsType: "ext4", VolumeId: "v-race"}
		var mu sync.Mutex
		var bad []string
		note := func(op string, err error) {
			switch status.Code(err) {
			case codes.OK, codes.Aborted, codes.FailedPrecondition, codes.NotFound:
				return
			}
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%s: %v", op, err))
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					ctx, cancel := ctx5()
					switch (w + i) % 4 {
					case 0, 2:
						_, err := h.vc.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: spec})
						note("stage", err)
					case 1:
						_, err := h.vc.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target})
						if claims && status.Code(err) == codes.FailedPrecondition {
							err = nil
						}
						note("unstage", err)
					case 3:
						if !claims {
							break
						}
						sb := fmt.Sprintf("sb-race-%d", w%2)
						_, err := h.rc.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: target, SandboxId: sb,
							HandlerEndpoint: h.endpointA})
						note("claim", err)
						_, err = h.rc.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, SandboxId: sb})
						note("release", err)
					}
					cancel()
				}
			}()
		}
		wg.Wait()
		ctx, cancel := ctx5()
		defer cancel()
		_, _ = h.rc.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: target, Force: true})
		if _, err := h.vc.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target}); err != nil {
			return err
		}
		if len(bad) > 0 {
			return status.Errorf(codes.Internal, "%d unexpected answers, first: %s", len(bad), bad[0])
		}
		return nil
	}
}
