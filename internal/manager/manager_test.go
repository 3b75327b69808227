package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/hostdev/sysfstree"
	"crust.dev/crust/internal/katadir"
	"crust.dev/crust/internal/store"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/validate"
)

// env is a manager on real parts: store, Kata projection and validator in temp dirs, with block device
// nodes made by mknod (never opened, only stat'ed) and what the kernel would say of them in a sysfs
// tree (more devices than a host has).
type env struct {
	t        testing.TB
	root     string
	kubelet  string
	devDir   string
	stateDir string
	kataDir  string
	allow    []string // device patterns allowed besides devDir's nodes
	sysfs    string
	m        *Manager
	k        *katadir.Adapter // the Kata adapter, wired as crustd wires it
	st       *store.Store     // the store of m, which holds stateDir
	loaded   *store.LoadReport

	sandboxes katadir.SandboxFinder // nil: no discovery of Kata sandboxes
	fwd       Forwarder             // nil: no forwarding
	mounts    HostMounts            // nil: no mount check
	sockets   HandlerSockets        // nil: no check of handler endpoints
	devices   Devices               // nil: a device shares storage with itself alone
	history   int                   // Config.WatchHistory; 0: the default
}

func newEnv(t testing.TB) *env {
	t.Helper()
	testutil.RequireRoot(t, "to make block device nodes")
	root := t.TempDir()
	e := &env{
		t: t, root: root,
		kubelet:  filepath.Join(root, "kubelet"),
		devDir:   filepath.Join(root, "dev"),
		stateDir: filepath.Join(root, "state"),
		kataDir:  filepath.Join(root, "kata"),
		sysfs:    filepath.Join(root, "sys"),
	}
	for _, d := range []string{e.kubelet, e.devDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 64 {
		e.mknod(fmt.Sprintf("disk%d", i), 7, uint32(100+i))
	}
	t.Cleanup(e.closeStore)
	e.reopen()
	return e
}

func (e *env) mknod(name string, major, minor uint32) string {
	p := filepath.Join(e.devDir, name)
	_ = os.Remove(p)
	if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(major, minor))); err != nil {
		e.t.Fatal(err)
	}
	if err := sysfstree.Add(e.sysfs, sysfstree.Device{Dir: fmt.Sprintf("virtual/block/%d:%d", major, minor),
		Major: major, Minor: minor, Name: name}); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// addReal tells the env's sysfs tree what the kernel calls the real block device dev, so that a test may
// stage it.
func (e *env) addReal(dev string) {
	e.t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		e.t.Fatal(err)
	}
	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	if err := sysfstree.Add(e.sysfs, sysfstree.Device{Dir: fmt.Sprintf("virtual/block/%d:%d", major, minor),
		Major: major, Minor: minor, Name: filepath.Base(dev)}); err != nil {
		e.t.Fatal(err)
	}
	e.allow = append(e.allow, dev)
}

// realLoop attaches a loop device of size bytes, makes it known to the env's sysfs and allow-list
// (addReal) and reopens the manager so that it can be staged; it returns the device and its image file.
func (e *env) realLoop(size int64) (dev, img string) {
	e.t.Helper()
	dev, img = testutil.Loop(e.t, size)
	e.addReal(dev)
	e.reopen()
	return dev, img
}

// reopen starts a new manager on the same directories, as a restarted crustd would.
func (e *env) reopen() {
	e.t.Helper()
	if err := e.open(); err != nil {
		e.t.Fatal(err)
	}
}

// open is reopen that returns Open's error, for tests of what a start must survive.
func (e *env) open() error {
	v, err := validate.New(validate.Config{KubeletDir: e.kubelet, DeviceAllow: append([]string{e.devDir + "/*", "/dev/disk*"}, e.allow...),
		Sysfs: e.sysfs})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.closeStore() // the previous crustd has ended
	st, loaded, err := store.Open(e.stateDir, "boot-1", log)
	if err != nil {
		return err
	}
	e.st, e.loaded = st, loaded
	proj, err := katadir.New(e.kataDir)
	if err != nil {
		return err
	}
	e.k = katadir.NewAdapter(proj, e.sandboxes, log)
	e.m, err = Open(Config{Validator: v, Store: st, Subscribers: []Subscriber{e.k}, Claims: e.k, KubeletDir: e.kubelet,
		LockWait: time.Minute, WatchBuffer: 16, WatchHistory: e.history, Log: log, Forwarder: e.fwd, Mounts: e.mounts,
		Sockets: e.sockets, Devices: e.devices, Revisions: st}, Loaded(*loaded))
	if err != nil {
		return err
	}
	e.k.Bind(e.m)
	return nil
}

// stop ends the manager as crustd's clean stop does (Close), so that the next reopen goes on from its
// revision.
func (e *env) stop() {
	e.t.Helper()
	if err := e.m.Close(); err != nil {
		e.t.Fatal(err)
	}
}

// closeStore gives up the state directory of the last store open opened, if any.
func (e *env) closeStore() {
	if e.st != nil {
		e.st.Close()
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (e *env) target(i int) string {
	return filepath.Join(e.kubelet, "pods", fmt.Sprintf("pod-%d", i%4), "volumes", "kubernetes.io~csi", fmt.Sprintf("pv%d", i), "mount")
}

func (e *env) spec(i int, device int) *crustv1.VolumeSpec {
	return &crustv1.VolumeSpec{
		VolumeTargetPath:  e.target(i),
		VolumeBackingPath: filepath.Join(e.devDir, fmt.Sprintf("disk%d", device)),
		FsType:            "ext4",
		MountFlags:        []string{"noatime"},
	}
}

// stageLoop stages spec backed by a new real loop device of size bytes (see realLoop), as a test's
// precondition, and returns the device and its image file.
func (e *env) stageLoop(spec *crustv1.VolumeSpec, size int64) (dev, img string) {
	e.t.Helper()
	dev, img = e.realLoop(size)
	spec.VolumeBackingPath = dev
	e.stage(spec)
	return dev, img
}

// stage stages spec, as a test's precondition: a failure ends the test.
func (e *env) stage(spec *crustv1.VolumeSpec) {
	e.t.Helper()
	if _, err := e.m.Stage(context.Background(), spec); err != nil {
		e.t.Fatal(err)
	}
}

func code(err error) string {
	for _, k := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
		errdefs.ErrFailedPrecondition, errdefs.ErrAborted, errdefs.ErrUnavailable} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return "ok"
}

func TestStageIsIdempotentAndConflictsAreRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first, err := e.m.Stage(ctx, e.spec(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.m.Stage(ctx, e.spec(0, 0))
	if err != nil || !proto.Equal(first, again) {
		t.Fatalf("repeat stage: %v, same volume %t", err, proto.Equal(first, again))
	}
	for _, tc := range []struct {
		name   string
		mutate func(*crustv1.VolumeSpec)
		field  string
	}{
		{"other device", func(s *crustv1.VolumeSpec) { s.VolumeBackingPath = filepath.Join(e.devDir, "disk1") }, "volume_backing_path"},
		{"other fs", func(s *crustv1.VolumeSpec) { s.FsType = "xfs" }, "fs_type"},
		{"read-only", func(s *crustv1.VolumeSpec) { s.ReadOnly = true }, "read_only"},
		{"options", func(s *crustv1.VolumeSpec) { s.MountFlags = nil }, "mount_flags"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.spec(0, 0)
			tc.mutate(s)
			_, err := e.m.Stage(ctx, s)
			if !errors.Is(err, errdefs.ErrAlreadyExists) {
				t.Fatalf("got %v, want AlreadyExists", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("message %q does not name %s", err, tc.field)
			}
			got, _ := e.m.Get(ctx, e.target(0))
			if !proto.Equal(got, first) {
				t.Fatal("a refused stage changed the volume")
			}
		})
	}
	// The device node replaced by another device under the same name: same spec, new dev_t.
	e.mknod("disk0", 7, 250)
	if _, err := e.m.Stage(ctx, e.spec(0, 0)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("same spec, other device number: %v, want AlreadyExists", err)
	}
}

func TestRefusedRequestsChangeNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	bad := e.spec(0, 0)
	bad.FsType = "vfat"
	if _, err := e.m.Stage(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("got %v", err)
	}
	if n := len(e.m.List(ctx)); n != 0 {
		t.Fatalf("%d volumes after a refused stage", n)
	}
	entries, _ := os.ReadDir(e.kataDir)
	for _, en := range entries {
		if en.Name() != ".crust-tmp" {
			t.Fatalf("Kata dir has %s after a refused stage", en.Name())
		}
	}
	e.reopen()
	if n := len(e.m.List(ctx)); n != 0 {
		t.Fatalf("%d volumes in the store after a refused stage", n)
	}
}

func TestUnstageIsIdempotentAndRemovesProjection(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	dir := filepath.Join(e.kataDir, kata.VolumeDirName(e.target(0)))
	if _, err := os.Stat(filepath.Join(dir, kata.MountInfoFileName)); err != nil {
		t.Fatalf("projection missing: %v", err)
	}
	for range 2 {
		if _, err := e.m.Unstage(ctx, e.target(0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("projection dir still there: %v", err)
	}
	if _, err := e.m.Get(ctx, e.target(0)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after unstage: %v", err)
	}
	e.reopen()
	if _, err := e.m.Get(ctx, e.target(0)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after restart: %v", err)
	}
}

func TestClaimRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tp := e.target(0)
	if _, err := e.m.Claim(ctx, tp, "sb1", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("claim of unknown: %v", err)
	}
	e.stage(e.spec(0, 0))
	steps := []struct {
		name    string
		do      func() error
		want    string
		sandbox string // holder afterwards
	}{
		{"claim", func() error { _, err := e.m.Claim(ctx, tp, "sb1", "unix:///run/h1.sock"); return err }, "ok", "sb1"},
		{"claim again", func() error { _, err := e.m.Claim(ctx, tp, "sb1", "unix:///run/h1.sock"); return err }, "ok", "sb1"},
		{"other sandbox", func() error { _, err := e.m.Claim(ctx, tp, "sb2", ""); return err }, "failed precondition", "sb1"},
		{"bad sandbox id", func() error { _, err := e.m.Claim(ctx, tp, "../x", ""); return err }, "invalid argument", "sb1"},
		{"tcp endpoint", func() error { _, err := e.m.Claim(ctx, tp, "sb1", "tcp://10.0.0.1:1"); return err }, "invalid argument", "sb1"},
		{"release by other", func() error { return e.m.Release(ctx, tp, "sb2", false) }, "failed precondition", "sb1"},
		{"release", func() error { return e.m.Release(ctx, tp, "sb1", false) }, "ok", ""},
		{"release again", func() error { return e.m.Release(ctx, tp, "sb1", false) }, "ok", ""},
		{"claim by sb2", func() error { _, err := e.m.Claim(ctx, tp, "sb2", ""); return err }, "ok", "sb2"},
		{"forced release", func() error { return e.m.Release(ctx, tp, "", true) }, "ok", ""},
	}
	for _, s := range steps {
		if got := code(s.do()); got != s.want {
			t.Fatalf("%s: %s, want %s", s.name, got, s.want)
		}
		e.reopen() // every acknowledged claim survives a restart
		v, err := e.m.Get(ctx, tp)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.GetClaim().GetSandboxId(); got != s.sandbox {
			t.Fatalf("%s: holder %q, want %q", s.name, got, s.sandbox)
		}
	}
}

func TestClaimChecksDeviceNumber(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	e.mknod("disk0", 8, 16) // another device now answers to the staged path
	_, err := e.m.Claim(ctx, e.target(0), "sb1", "")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("claim of a swapped device: %v, want FailedPrecondition", err)
	}
}

func TestKataSandboxFileIsAClaim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	if err := katatest.RecordSandbox(e.kataDir, e.target(0), "katasb"); err != nil {
		t.Fatal(err)
	}
	v, err := e.m.Get(ctx, e.target(0))
	if err != nil {
		t.Fatal(err)
	}
	if c := v.GetClaim(); c.GetSandboxId() != "katasb" || !c.GetKata() {
		t.Fatalf("claim %v, want the Kata sandbox", c)
	}
	if _, err := e.m.Claim(ctx, e.target(0), "other", ""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("claim over a Kata claim: %v", err)
	}
	// A restart rebuilds the projection and keeps Kata's sandbox file.
	e.reopen()
	if ids, _ := kata.SandboxIDs(e.kataDir, e.target(0)); len(ids) != 1 || ids[0] != "katasb" {
		t.Fatalf("sandbox ids after restart: %v", ids)
	}
}

func TestWatchSeesEventsInOrder(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(9, 9))
	w := e.m.Watch(true)
	defer w.Stop()
	tp := e.target(0)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.m.Stage(ctx, e.spec(0, 0))
	must(err)
	_, err = e.m.Stage(ctx, e.spec(0, 0)) // a repeat is no change: no event
	must(err)
	_, err = e.m.Claim(ctx, tp, "sb1", "")
	must(err)
	must(e.m.Release(ctx, tp, "sb1", false))
	_, err = e.m.Unstage(ctx, tp)
	must(err)
	want := []crustv1.EventType{
		crustv1.EventType_EVENT_TYPE_EXISTING, crustv1.EventType_EVENT_TYPE_SYNCED,
		crustv1.EventType_EVENT_TYPE_STAGED, crustv1.EventType_EVENT_TYPE_CLAIMED,
		crustv1.EventType_EVENT_TYPE_RELEASED, crustv1.EventType_EVENT_TYPE_UNSTAGED,
	}
	var lastRev uint64
	for i, typ := range want {
		ev := <-w.Events()
		if ev.GetType() != typ {
			t.Fatalf("event %d: %v, want %v", i, ev.GetType(), typ)
		}
		if i >= 2 {
			if ev.GetRevision() != lastRev+1 || ev.GetVolume().GetSpec().GetVolumeTargetPath() != tp {
				t.Fatalf("event %d: revision %d after %d, target %q", i, ev.GetRevision(), lastRev, ev.GetVolume().GetSpec().GetVolumeTargetPath())
			}
		}
		lastRev = ev.GetRevision()
	}
	select {
	case ev := <-w.Events():
		t.Fatalf("unexpected event %v", ev)
	default:
	}
}

func TestSlowWatcherIsCutOffNotBlocking(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w := e.m.Watch(false)
	for range e.m.cfg.WatchBuffer/2 + 1 {
		e.stage(e.spec(0, 0))
		if _, err := e.m.Unstage(ctx, e.target(0)); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for range w.Events() {
		n++
	}
	if n != e.m.cfg.WatchBuffer || !errors.Is(w.Err(), errdefs.ErrAborted) {
		t.Fatalf("got %d events then %v; want %d then Aborted", n, w.Err(), e.m.cfg.WatchBuffer)
	}
}

// TestConcurrentOverlappingTargets runs 64 goroutines against 16 targets at once. For each target some
// goroutines stage the same spec and some a conflicting one, and some claim it for different sandboxes.
// Whatever the interleaving, the outcome must be one a serial order gives: exactly one spec wins per
// target, every caller with that spec succeeds and every other gets AlreadyExists; exactly one sandbox
// holds each claim; and store and projection agree after a restart.
func TestConcurrentOverlappingTargets(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const goroutines, targets = 64, 16
	type result struct {
		target, device int
		stageErr       error
		sandbox        string
		claimErr       error
	}
	results := make([]result, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tg := g % targets
			dev := tg
			if g%3 == 0 {
				dev = 32 + tg // a conflicting spec for the same target
			}
			r := result{target: tg, device: dev, sandbox: fmt.Sprintf("sb%d", g%2)}
			_, r.stageErr = e.m.Stage(ctx, e.spec(tg, dev))
			if r.stageErr == nil {
				_, r.claimErr = e.m.Claim(ctx, e.target(tg), r.sandbox, "")
			}
			results[g] = r
		}()
	}
	wg.Wait()

	for tg := range targets {
		v, err := e.m.Get(ctx, e.target(tg))
		if err != nil {
			t.Fatalf("target %d: %v", tg, err)
		}
		winner := filepath.Base(v.GetSpec().GetVolumeBackingPath())
		holders := map[string]bool{}
		for _, r := range results {
			if r.target != tg {
				continue
			}
			mine := fmt.Sprintf("disk%d", r.device)
			switch {
			case mine == winner && r.stageErr != nil:
				t.Errorf("target %d: the winning spec was refused: %v", tg, r.stageErr)
			case mine != winner && !errors.Is(r.stageErr, errdefs.ErrAlreadyExists):
				t.Errorf("target %d: a losing spec got %v, want AlreadyExists", tg, r.stageErr)
			}
			if r.stageErr == nil && r.claimErr == nil {
				holders[r.sandbox] = true
			} else if r.stageErr == nil && !errors.Is(r.claimErr, errdefs.ErrFailedPrecondition) {
				t.Errorf("target %d: a losing claim got %v, want FailedPrecondition", tg, r.claimErr)
			}
		}
		if len(holders) != 1 || !holders[v.GetClaim().GetSandboxId()] {
			t.Errorf("target %d: successful claimers %v, holder %q", tg, holders, v.GetClaim().GetSandboxId())
		}
	}
	before := e.m.List(ctx)
	e.reopen()
	after := e.m.List(ctx)
	if len(before) != targets || len(after) != targets {
		t.Fatalf("%d volumes before restart, %d after, want %d", len(before), len(after), targets)
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Fatalf("volume %d differs after restart:\n%v\n%v", i, before[i], after[i])
		}
		got, err := kata.Get(e.kataDir, before[i].GetSpec().GetVolumeTargetPath())
		if err != nil || got.Device != before[i].GetSpec().GetVolumeBackingPath() {
			t.Fatalf("projection of %d: %v, %v", i, got, err)
		}
	}
	if n := e.m.locks.Len(); n != 0 {
		t.Fatalf("%d locks left", n)
	}
}

func TestGarbageCollectsVolumesOfDeletedPods(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := range 8 { // two volumes in each of pods pod-0 .. pod-3
		if err := os.MkdirAll(e.target(i), 0o755); err != nil {
			t.Fatal(err)
		}
		e.stage(e.spec(i, i))
	}
	// A pass needs only the target paths: reading each volume's claim (a Kata directory's listing each)
	// would cost a node with thousands of volumes that much work every pass.
	claims := &countingClaims{ClaimSource: e.m.cfg.Claims}
	e.m.cfg.Claims = claims
	if gone := e.m.CollectGarbage(ctx); len(gone) != 0 {
		t.Fatalf("collected %v while every pod exists", gone)
	}
	// pod-22's name starts with pod-2's.
	pod22 := e.spec(8, 8)
	pod22.VolumeTargetPath = strings.Replace(e.target(2), "/pod-2/", "/pod-22/", 1)
	if err := os.MkdirAll(pod22.VolumeTargetPath, 0o755); err != nil {
		t.Fatal(err)
	}
	e.stage(pod22)
	for _, pod := range []string{"pod-1", "pod-2", "pod-22"} {
		if err := os.RemoveAll(filepath.Join(e.kubelet, "pods", pod)); err != nil {
			t.Fatal(err)
		}
	}
	// A pass for named pods (a pod directory seen going) looks at their volumes only.
	if gone, want := e.m.CollectGarbage(ctx, "pod-2", "pod-0", "pod-2"), []string{e.target(2), e.target(6)}; !slices.Equal(gone, want) {
		t.Fatalf("collected %v for pods pod-2 and pod-0, want %v", gone, want)
	}
	if gone, want := e.m.CollectGarbage(ctx), []string{e.target(1), e.target(5), pod22.VolumeTargetPath}; !slices.Equal(gone, want) {
		t.Fatalf("collected %v, want %v", gone, want)
	}
	if n := claims.asked.Load(); n != 0 {
		t.Errorf("garbage collection asked the claim source %d times, want none", n)
	}
	if n := len(e.m.List(ctx)); n != 4 {
		t.Fatalf("%d volumes left, want 4", n)
	}
}

// countingClaims is a claim source that counts the claims it is asked for.
type countingClaims struct {
	ClaimSource
	asked atomic.Int32
}

func (c *countingClaims) Claim(v *crustv1.Volume) *crustv1.Claim {
	c.asked.Add(1)
	return c.ClaimSource.Claim(v)
}

// A repeated claim by the same sandbox checks the device again: a path that names another device since
// the first claim is refused, and the claim stays as it was.
func TestReclaimChecksTheDevice(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	tp := e.target(0)
	if _, err := e.m.Claim(ctx, tp, "sb1", "unix:///run/h1.sock"); err != nil {
		t.Fatal(err)
	}
	e.mknod("disk0", 8, 0) // another disk's number at the staged path
	if _, err := e.m.Claim(ctx, tp, "sb1", "unix:///run/h1.sock"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("re-claim after the device changed: %v; want failed precondition", err)
	}
	if v, err := e.m.Get(ctx, tp); err != nil || v.GetClaim().GetSandboxId() != "sb1" {
		t.Fatalf("claim after the refusal: %v, %v", v.GetClaim(), err)
	}
}

// A claim a Kata shim recorded is released by force (or by its own sandbox), not silently kept: its
// sandbox-id file goes, a watch event says so, and another sandbox may then claim the volume. Another
// sandbox without force is refused.
func TestReleaseKataClaim(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage(e.spec(0, 0))
	tp := e.target(0)
	if err := katatest.RecordSandbox(e.kataDir, tp, "katasb"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Release(ctx, tp, "other", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("release of a Kata claim by another sandbox: %v; want failed precondition", err)
	}
	w := e.m.Watch(false)
	defer w.Stop()
	if err := e.m.Release(ctx, tp, "", true); err != nil {
		t.Fatalf("forced release of a Kata claim: %v", err)
	}
	if ev := <-w.Events(); ev.GetType() != crustv1.EventType_EVENT_TYPE_RELEASED {
		t.Errorf("event %v, want RELEASED", ev.GetType())
	}
	if ids, _ := kata.SandboxIDs(e.kataDir, tp); len(ids) != 0 {
		t.Fatalf("sandbox ids after a forced release: %v", ids)
	}
	if v, err := e.m.Get(ctx, tp); err != nil || v.GetClaim() != nil {
		t.Fatalf("claim after a forced release: %v, %v", v.GetClaim(), err)
	}
	if _, err := e.m.Claim(ctx, tp, "sb2", ""); err != nil {
		t.Fatalf("claim after the Kata claim was released: %v", err)
	}
}

// One writer per device, whatever the target path: a second sandbox's claim is refused while another
// holds the device and either claim is read-write (a Kata claim counts); read-only claims share; one
// sandbox may use the device through two targets; the device is free again once released, and a target
// staged again on another device holds only that one.
func TestOneWriterPerDevice(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ro := func(s *crustv1.VolumeSpec) *crustv1.VolumeSpec { s.ReadOnly = true; return s }
	for _, s := range []*crustv1.VolumeSpec{
		e.spec(0, 0), e.spec(1, 0), e.spec(2, 0), // disk0 read-write, three paths
		ro(e.spec(3, 1)), ro(e.spec(4, 1)), // disk1 read-only, two paths
		e.spec(5, 2), ro(e.spec(6, 2)), // disk2 read-write and read-only
		e.spec(7, 3), e.spec(8, 3), // disk3, claimed by a Kata shim through one path
		ro(e.spec(9, 4)), ro(e.spec(10, 4)), e.spec(11, 4), // disk4 read-only twice, and read-write
	} {
		e.stage(s)
	}
	claim := func(i int, sb string) error { _, err := e.m.Claim(ctx, e.target(i), sb, ""); return err }
	for _, st := range []struct {
		name string
		run  func() error
		want string
	}{
		{"sb1 takes disk0 read-write", func() error { return claim(0, "sb1") }, "ok"},
		{"sb2 through another path", func() error { return claim(1, "sb2") }, "failed precondition"},
		// Each target is a disk of its own in the sandbox: two of one device, one read-write, is refused.
		{"sb1 through another path", func() error { return claim(2, "sb1") }, "failed precondition"},
		{"read-only shares", func() error { return claim(3, "sb1") }, "ok"},
		{"read-only shares with another sandbox", func() error { return claim(4, "sb2") }, "ok"},
		{"read-write holder", func() error { return claim(5, "sb1") }, "ok"},
		{"read-only beside a writer", func() error { return claim(6, "sb2") }, "failed precondition"},
		{"read-only beside its own writer", func() error { return claim(6, "sb1") }, "failed precondition"},
		{"one sandbox, two read-only targets of a device", func() error {
			return errors.Join(claim(9, "sb3"), claim(10, "sb3"))
		}, "ok"},
		{"and a read-write third", func() error { return claim(11, "sb3") }, "failed precondition"},
		{"a Kata claim holds the device", func() error {
			if err := katatest.RecordSandbox(e.kataDir, e.target(7), "katasb"); err != nil {
				return err
			}
			return claim(8, "sb2")
		}, "failed precondition"},
		{"sb1 lets disk0 go", func() error {
			return errors.Join(e.m.Release(ctx, e.target(0), "sb1", false), e.m.Release(ctx, e.target(2), "sb1", false))
		}, "ok"},
		{"sb2 may now write disk0", func() error { return claim(1, "sb2") }, "ok"},
		{"and still holds it after a restart", func() error { e.reopen(); return claim(0, "sb1") }, "failed precondition"},
		// A target staged again on another device no longer counts for its first one.
		{"a target moves from disk5 to disk6", func() error {
			e.stage(e.spec(12, 5))
			if _, err := e.m.Unstage(ctx, e.target(12)); err != nil {
				return err
			}
			e.stage(e.spec(12, 6))
			return claim(12, "sb1")
		}, "ok"},
		{"disk5 is free", func() error { e.stage(e.spec(13, 5)); return claim(13, "sb2") }, "ok"},
		{"disk6 is not: its deposit is refused", func() error { _, err := e.m.Stage(ctx, e.spec(14, 6)); return err }, "failed precondition"},
	} {
		if got := code(st.run()); got != st.want {
			t.Fatalf("%s: %s, want %s", st.name, got, st.want)
		}
	}
}

// Two sandboxes claiming one device through two paths at the same instant: exactly one wins, every time.
func TestOneWriterPerDeviceRace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, s := range []*crustv1.VolumeSpec{e.spec(0, 0), e.spec(1, 0)} {
		e.stage(s)
	}
	for round := range 50 {
		errs := make(chan error, 2)
		for i, sb := range []string{"sbA", "sbB"} {
			go func() { _, err := e.m.Claim(ctx, e.target(i), sb, ""); errs <- err }()
		}
		won := 0
		for range 2 {
			if err := <-errs; err == nil {
				won++
			} else if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatal(err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d sandboxes hold the device read-write", round, won)
		}
		for i, sb := range []string{"sbA", "sbB"} {
			if err := e.m.Release(ctx, e.target(i), sb, false); err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatal(err)
			}
		}
	}
}

// ListPage pages through the descriptors in target path order: each page holds at most maxEntries, and
// at least one however small maxBytes is; "more" is set exactly when descriptors follow; a page starts
// strictly after the given target, so that no descriptor is seen twice, even when the one named was
// unstaged between pages.
func TestListPage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var want []string
	for i := range 25 {
		s := e.spec(i, i%2)
		e.stage(s)
		want = append(want, s.GetVolumeTargetPath())
	}
	slices.Sort(want)
	for _, tc := range []struct {
		name                 string
		maxEntries, maxBytes int
		pages                []int
	}{
		{"no limits", 0, 0, []int{25}},
		{"7 a page", 7, 0, []int{7, 7, 7, 4}},
		{"exactly 25", 25, 0, []int{25}},
		{"one byte a page", 0, 1, slices.Repeat([]int{1}, 25)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			var sizes []int
			after := ""
			for {
				page, more := e.m.ListPage(ctx, after, tc.maxEntries, tc.maxBytes)
				sizes = append(sizes, len(page))
				for _, v := range page {
					got = append(got, v.GetSpec().GetVolumeTargetPath())
				}
				if !more {
					break
				}
				after = got[len(got)-1]
			}
			if !slices.Equal(got, want) || !slices.Equal(sizes, tc.pages) {
				t.Fatalf("pages of %v listed %d descriptors in order %t; want %v", sizes, len(got), slices.IsSorted(got), tc.pages)
			}
		})
	}
	// The last target of a page is unstaged before the next page is asked for.
	page, more := e.m.ListPage(ctx, "", 10, 0)
	last := page[len(page)-1].GetSpec().GetVolumeTargetPath()
	if _, err := e.m.Unstage(ctx, last); err != nil || !more {
		t.Fatalf("unstage %s: %v (more %t)", last, err, more)
	}
	next, _ := e.m.ListPage(ctx, last, 0, 0)
	if len(next) != 15 || next[0].GetSpec().GetVolumeTargetPath() != want[10] {
		t.Fatalf("after an unstaged target: %d descriptors from %s; want 15 from %s", len(next), next[0].GetSpec().GetVolumeTargetPath(), want[10])
	}
}
