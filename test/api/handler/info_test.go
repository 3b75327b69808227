package handler_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/handler"
	"crust.dev/crust/api/version"
	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil/crustdtest"
)

// session returns a context for t's calls, bounded, and a handler's client of the crustd at socket,
// closed when t ends.
func session(t *testing.T, socket string) (context.Context, *handler.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := handler.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return ctx, c
}

// ownCrustd is a crustd of a test's own, for a test that restarts it.
type ownCrustd struct {
	t    *testing.T
	dir  string
	cfg  daemon.Config
	stop func() error
}

// startOwn starts a crustd of crustdtest.FileConfig under a directory of t's; it is stopped when t ends.
func startOwn(t *testing.T) *ownCrustd {
	t.Helper()
	o := &ownCrustd{t: t, dir: t.TempDir()}
	var err error
	if o.cfg, err = crustdtest.FileConfig(o.dir); err != nil {
		t.Fatal(err)
	}
	o.start()
	t.Cleanup(func() {
		if err := o.stop(); err != nil {
			t.Error(err)
		}
	})
	return o
}

func (o *ownCrustd) start() {
	o.t.Helper()
	var err error
	if o.stop, err = crustdtest.Start(o.cfg, nil); err != nil {
		o.t.Fatal(err)
	}
}

// restart stops crustd cleanly (SIGTERM's path) and starts it again.
func (o *ownCrustd) restart() {
	o.t.Helper()
	if err := o.stop(); err != nil {
		o.t.Fatal(err)
	}
	o.start()
}

// TestInfo: a handler asks crustd what it speaks: its version, crust.v1, and the features of its
// configuration (crustdtest's: image files allowed, no Kata projection).
func TestInfo(t *testing.T) {
	ctx, c := session(t, socket)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetVersion() != version.Get().Version || !slices.Equal(info.GetApiVersions(), []string{"crust.v1"}) {
		t.Errorf("version %q, API %q; want %q, crust.v1", info.GetVersion(), info.GetApiVersions(), version.Get().Version)
	}
	for _, f := range []string{crustd.FeatureWatchResume, crustd.FeatureHandlerSocketCheck, crustd.FeatureHostMountCheck,
		crustd.FeatureRawBlock, crustd.FeatureIOLimits, crustd.FeatureFileBacked, crustd.FeatureHandlerGoneRelease} {
		if !slices.Contains(info.GetFeatures(), f) {
			t.Errorf("features %q lack %q", info.GetFeatures(), f)
		}
	}
	if slices.Contains(info.GetFeatures(), crustd.FeatureKataProjection) {
		t.Errorf("features %q name the Kata projection, which this crustd does not write", info.GetFeatures())
	}
	if !slices.IsSorted(info.GetFeatures()) {
		t.Errorf("features %q are not sorted", info.GetFeatures())
	}
}

// errSynced ends a watch at its SYNCED event.
var errSynced = errors.New("synced")

// watchUntilSynced runs c.Watch until its SYNCED event and returns the events, the SYNCED one last, as
// "TYPE@revision" words (resumed marked "+"), and the SYNCED event's revision.
func watchUntilSynced(ctx context.Context, c *handler.Client, existing bool, opts ...handler.WatchOption) ([]string, uint64, error) {
	var (
		got []string
		rev uint64
	)
	err := c.Watch(ctx, existing, func(ev *crustv1.WatchVolumesResponse) error {
		w := fmt.Sprintf("%s@%d", strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_"), ev.GetRevision())
		if ev.GetResumed() {
			w += "+"
		}
		got = append(got, w)
		if ev.GetType() == crustv1.EventType_EVENT_TYPE_SYNCED {
			rev = ev.GetRevision()
			return errSynced
		}
		return nil
	}, opts...)
	if errors.Is(err, errSynced) {
		err = nil
	}
	return got, rev, err
}

// TestWatchResumes: through crustd's socket, a watch resumed after the revision of its SYNCED gets the
// changes made while it was away, then a resumed SYNCED; a revision crustd never issued is OutOfRange, or,
// with sendExisting, the listing again.
func TestWatchResumes(t *testing.T) {
	ctx, c := session(t, socket)
	_, rev, err := watchUntilSynced(ctx, c, true)
	if err != nil {
		t.Fatal(err)
	}
	target, driver, err := deposit("pv-resume")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = driver.Close() }()
	if _, err := c.Claim(ctx, target, "sandbox-r", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, target, "sandbox-r"); err != nil {
		t.Fatal(err)
	}
	got, now, err := watchUntilSynced(ctx, c, false, handler.SinceRevision(rev))
	want := []string{fmt.Sprintf("STAGED@%d", rev+1), fmt.Sprintf("CLAIMED@%d", rev+2), fmt.Sprintf("RELEASED@%d", rev+3),
		fmt.Sprintf("SYNCED@%d+", rev+3)}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("resumed after %d: %q, %v; want %q", rev, got, err, want)
	}

	if _, _, err := watchUntilSynced(ctx, c, false, handler.SinceRevision(now+100)); !errors.Is(err, errdefs.ErrOutOfRange) {
		t.Errorf("resumed after a revision never issued: %v; want OutOfRange", err)
	}
	got, _, err = watchUntilSynced(ctx, c, true, handler.SinceRevision(now+100))
	if err != nil || len(got) < 2 || !strings.HasPrefix(got[0], "EXISTING@") || got[len(got)-1] != fmt.Sprintf("SYNCED@%d", now) {
		t.Errorf("resumed after a revision never issued, or existing: %q, %v; want the listing", got, err)
	}
	if _, err := driver.Volumes().UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target}); err != nil {
		t.Fatal(err)
	}
}

// TestClaimRefusesASocketCrustdCannotSee: a claim whose endpoint's socket crustd cannot see is
// FailedPrecondition naming the path and where handler sockets go (beside crustd's own); the same claim
// with a socket there succeeds.
func TestClaimRefusesASocketCrustdCannotSee(t *testing.T) {
	ctx, c := session(t, socket)
	target, driver, err := deposit("pv-socket")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = driver.Close() }()
	nowhere := filepath.Join(root, "nowhere", "h.sock")
	_, err = c.Claim(ctx, target, "sandbox-s", "unix://"+nowhere)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), nowhere) ||
		!strings.Contains(err.Error(), filepath.Join(root, "run", "handlers")) {
		t.Errorf("claim with a socket crustd cannot see: %v; want FailedPrecondition naming %s and where sockets go", err, nowhere)
	}
	if v, err := c.Get(ctx, target); err != nil || v.GetClaim() != nil {
		t.Fatalf("after the refusal: %v, %v; want no claim", v.GetClaim(), err)
	}
	stop, endpoint, err := handler.ServeHandler(crustd.HandlerSocket(socket, "sandbox-s"), guest{})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if v, err := c.Claim(ctx, target, "sandbox-s", endpoint); err != nil || v.GetClaim().GetHandlerEndpoint() != endpoint {
		t.Errorf("claim with a socket beside crustd's: %v, %v", v.GetClaim(), err)
	}
	if err := c.Release(ctx, target, "sandbox-s"); err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Volumes().UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target}); err != nil {
		t.Fatal(err)
	}
}

// TestRevisionsSurviveARestart: crustd stopped cleanly goes on from its last revision, and a watch resumes
// across the restart.
func TestRevisionsSurviveARestart(t *testing.T) {
	d := startOwn(t)
	_, driver, err := depositAt(d.dir, d.cfg.Socket, "pv-restart")
	if err != nil {
		t.Fatal(err)
	}
	_ = driver.Close()
	ctx, c := session(t, d.cfg.Socket)
	_, rev, err := watchUntilSynced(ctx, c, true)
	if err != nil {
		t.Fatal(err)
	}
	d.restart()
	if got, _, err := watchUntilSynced(ctx, c, false, handler.SinceRevision(rev)); err != nil || !slices.Equal(got, []string{fmt.Sprintf("SYNCED@%d+", rev)}) {
		t.Errorf("resumed after %d across a clean restart: %q, %v; want SYNCED@%d+", rev, got, err, rev)
	}
}
