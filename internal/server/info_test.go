package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/api/version"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/peercred"
)

// serve serves a server of m, with features, on a socket under a temporary directory for this process's
// user, and returns the socket.
func serve(t *testing.T, m *manager.Manager, features ...string) string {
	t.Helper()
	s := New(Config{Manager: m, Policy: peercred.Policy{UIDs: []uint32{uint32(os.Getuid())}}, Features: features})
	sock := filepath.Join(t.TempDir(), "crust.sock")
	l, err := unixsocket.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.GRPC.Serve(l) }()
	t.Cleanup(s.GRPC.Stop)
	return sock
}

// TestGetInfo: GetInfo answers the build's version and revision, the API version served, and the features
// it was given, sorted, each once.
func TestGetInfo(t *testing.T) {
	m, err := manager.Open(manager.Config{Validator: anySpec{}, Store: anySpec{}}, manager.Loaded{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := crustd.Dial(serve(t, m, crustd.FeatureRawBlock, crustd.FeatureWatchResume, crustd.FeatureRawBlock))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := crustv1.NewInfoServiceClient(conn).GetInfo(ctx, &crustv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	v := version.Get()
	if r.GetVersion() != v.Version || r.GetRevision() != v.Revision || !slices.Equal(r.GetApiVersions(), []string{"crust.v1"}) ||
		!slices.Equal(r.GetFeatures(), []string{crustd.FeatureRawBlock, crustd.FeatureWatchResume}) {
		t.Errorf("GetInfo: %v", r)
	}
}

// TestWatchVolumesResumes: over the socket, a watch with since_revision gets the changes since and a
// resumed SYNCED; a revision crustd cannot resume from is OUT_OF_RANGE, or with send_existing the listing.
func TestWatchVolumesResumes(t *testing.T) {
	m, err := manager.Open(manager.Config{Validator: anySpec{}, Store: anySpec{}}, manager.Loaded{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := crustd.Dial(serve(t, m))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, target := range []string{"/k/pods/p/volumes/a/mount", "/k/pods/p/volumes/b/mount", "/k/pods/p/volumes/c/mount"} {
		if _, err := crustv1.NewVolumeServiceClient(conn).StageVolume(ctx, &crustv1.StageVolumeRequest{
			Spec: &crustv1.VolumeSpec{VolumeTargetPath: target}}); err != nil {
			t.Fatal(err)
		}
	}
	rt := crustv1.NewRuntimeServiceClient(conn)
	watch := func(since uint64, existing bool, n int) ([]*crustv1.WatchVolumesResponse, error) {
		t.Helper()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := rt.WatchVolumes(ctx, &crustv1.WatchVolumesRequest{SinceRevision: &since, SendExisting: existing})
		if err != nil {
			return nil, err
		}
		var evs []*crustv1.WatchVolumesResponse
		for range n {
			ev, err := stream.Recv()
			if err != nil {
				return evs, err
			}
			evs = append(evs, ev)
		}
		return evs, nil
	}
	evs, err := watch(1, false, 3)
	if err != nil || len(evs) != 3 || evs[0].GetRevision() != 2 || evs[1].GetRevision() != 3 ||
		evs[0].GetType() != crustv1.EventType_EVENT_TYPE_STAGED || evs[2].GetType() != crustv1.EventType_EVENT_TYPE_SYNCED ||
		!evs[2].GetResumed() || evs[2].GetRevision() != 3 {
		t.Errorf("resume after 1: %v, %v; want STAGED@2 STAGED@3 SYNCED@3 resumed", evs, err)
	}
	if _, err := watch(9, false, 1); !errors.Is(err, errdefs.ErrOutOfRange) {
		t.Errorf("resume after 9, which was never issued: %v; want OutOfRange", err)
	}
	evs, err = watch(9, true, 4)
	if err != nil || evs[0].GetType() != crustv1.EventType_EVENT_TYPE_EXISTING || evs[3].GetType() != crustv1.EventType_EVENT_TYPE_SYNCED ||
		evs[3].GetResumed() {
		t.Errorf("resume after 9, or existing: %v, %v; want the listing", evs, err)
	}
}
