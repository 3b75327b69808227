package handler

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/fsnotify/fsnotify"

	"crust.dev/crust/api/dirwatch"
	"crust.dev/crust/api/kata"
)

// KataEvent is a change seen in Kata's direct-volume directory.
type KataEvent struct {
	// Path is the volume path (the publish target path).
	Path string
	// Volume is the volume as it now is, or nil when it was removed.
	Volume *kata.Volume
}

// WatchKataDir calls fn with every volume in dir (crustd's Kata projection, or files written by
// `kata-runtime direct-volume add`) and then with every change, until ctx ends (it then returns nil) or fn
// returns an error (returned as is). A change is a volume that appeared, changed (its mount info or its
// sandbox ids) or was removed; changes that happen in quick succession may be seen as one. It is for
// handlers that read files rather than call crustd.
func WatchKataDir(ctx context.Context, dir string, fn func(KataEvent) error) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }()
	if err := w.Add(dir); err != nil {
		return err
	}
	known := map[string]kata.Volume{}
	// rescan lists dir, watches every volume directory (sandbox-id files appear inside them) and reports
	// the difference from what was seen before. Listing the whole dir on an event is simpler than
	// following renames file by file, and the dir holds one entry per volume on the node.
	rescan := func() error {
		vols, err := kata.List(dir)
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		seen := map[string]bool{}
		for _, v := range vols {
			seen[v.Path] = true
			_ = w.Add(filepath.Join(dir, kata.VolumeDirName(v.Path))) // gone meanwhile: the next event tells
			if old, ok := known[v.Path]; ok && reflect.DeepEqual(old, v) {
				continue
			}
			known[v.Path] = v
			if err := fn(KataEvent{Path: v.Path, Volume: &v}); err != nil {
				return err
			}
		}
		for p := range known {
			if !seen[p] {
				delete(known, p)
				if err := fn(KataEvent{Path: p}); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := rescan(); err != nil {
		return err
	}
	// Events come in bursts (a rename into place is several): one rescan each.
	return dirwatch.Loop(ctx, w, nil, nil, func([]fsnotify.Event) error { return rescan() })
}
