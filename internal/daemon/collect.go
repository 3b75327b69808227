package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"crust.dev/crust/api/dirwatch"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/metrics"
)

// collect runs the garbage collector until ctx ends: a pass over every pod now and at every interval,
// and a pass over the pods whose directories went as soon as an entry of <kubeletDir>/pods is removed or
// renamed away, so that the descriptor of a pod deleted without an unpublish goes within moments instead
// of at the next tick, at the cost of that pod's descriptors alone. Each pass looks at the pod
// directories itself; the watch only says when, and where, to look. When the directory cannot be watched
// (no kubelet on the node yet, no inotify instance or watch left), the periodic passes go on, each trying
// the watch again, and a line says so once.
func collect(ctx context.Context, m *manager.Manager, met *metrics.Metrics, kubeletDir string, interval time.Duration, log *slog.Logger) {
	pods := filepath.Join(kubeletDir, "pods")
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("orphaned descriptors are collected only every --gc-interval: no inotify instance", "err", err, "gc_interval", interval)
	} else {
		defer func(w *fsnotify.Watcher) { _ = w.Close() }(w) // w itself: the fallback below forgets it
	}
	watching := true // until the first pass says otherwise
	pass := func(events []fsnotify.Event) error {
		if w != nil {
			err := w.Add(pods) // watched already: nothing changes
			switch {
			case err != nil && watching:
				log.Warn("orphaned descriptors are collected only every --gc-interval: cannot watch the pod directories",
					"dir", pods, "err", err, "gc_interval", interval)
			case err == nil && !watching:
				log.Info("watching the pod directories again: orphaned descriptors are collected as their pod's directory goes", "dir", pods)
			}
			watching = err == nil
		}
		met.CollectedGarbage(len(m.CollectGarbage(ctx, podsGone(pods, events)...)))
		return nil
	}
	_ = pass(nil)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	gone := func(ev fsnotify.Event) bool { return ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) }
	if err := dirwatch.Loop(ctx, w, gone, tick.C, pass); err != nil {
		// The watcher failed under the loop: the clock alone, as without one.
		log.Warn("orphaned descriptors are collected only every --gc-interval: the watch failed", "err", err, "gc_interval", interval)
		w = nil
		_ = dirwatch.Loop(ctx, nil, nil, tick.C, pass)
	}
}

// podsGone returns the names of the entries of pods that events say went, or nil (every pod) when an
// event is about anything else (pods itself removed) or there are no events (a tick: anything may have
// changed).
func podsGone(pods string, events []fsnotify.Event) []string {
	var uids []string
	for _, ev := range events {
		if filepath.Dir(ev.Name) != pods {
			return nil
		}
		uids = append(uids, filepath.Base(ev.Name))
	}
	return uids
}
