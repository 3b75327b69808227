package handler

import (
	"context"
	"errors"
	"testing"
	"time"

	"crust.dev/crust/api/kata"
)

// WatchKataDir hands over entries of every block volume type Kata's runtimes and their tools write, not
// only crust's own "directvol", with the type as written.
func TestWatchKataDirBlockVolumeTypes(t *testing.T) {
	dir := t.TempDir()
	want := map[string]string{
		"/var/lib/kubelet/pods/a/volumes/kubernetes.io~csi/pv/mount": kata.VolumeTypeDirect,
		"/var/lib/kubelet/pods/b/volumes/kubernetes.io~csi/pv/mount": kata.VolumeTypeBlock,
		"/var/lib/kubelet/pods/c/volumes/kubernetes.io~csi/pv/mount": kata.VolumeTypeBlk,
	}
	for path, vt := range want {
		if err := kata.AddMountInfo(dir, path, &kata.MountInfo{VolumeType: vt, Device: "/dev/vdc", FsType: "xfs"}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := map[string]string{}
	done := errors.New("all seen")
	err := WatchKataDir(ctx, dir, func(ev KataEvent) error {
		if ev.Volume == nil || !kata.IsBlockVolumeType(ev.Volume.MountInfo.VolumeType) {
			t.Errorf("event %+v: want a block volume", ev)
			return nil
		}
		seen[ev.Path] = ev.Volume.MountInfo.VolumeType
		if len(seen) == len(want) {
			return done
		}
		return nil
	})
	if !errors.Is(err, done) {
		t.Fatalf("WatchKataDir: %v; saw %v", err, seen)
	}
	for path, vt := range want {
		if seen[path] != vt {
			t.Errorf("%s: seen as %q, want %q", path, seen[path], vt)
		}
	}
}
