package dirwatch

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watcher watches a new temporary directory, returned opened as a root.
func watcher(t *testing.T) (*fsnotify.Watcher, *os.Root) {
	t.Helper()
	dir := t.TempDir()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return w, r
}

// run starts Loop and returns a channel that gets the events of each call of fn (fn answers with err)
// and one with Loop's result.
func run(ctx context.Context, w *fsnotify.Watcher, want func(fsnotify.Event) bool, tick <-chan time.Time, err error) (calls chan []fsnotify.Event, done chan error) {
	calls, done = make(chan []fsnotify.Event, 100), make(chan error, 1)
	go func() {
		done <- Loop(ctx, w, want, tick, func(evs []fsnotify.Event) error { calls <- evs; return err })
	}()
	return calls, done
}

func wait[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
	}
	var zero T
	return zero
}

func TestLoop(t *testing.T) {
	removed := func(ev fsnotify.Event) bool { return ev.Has(fsnotify.Remove) }
	for _, tc := range []struct {
		name   string
		want   func(fsnotify.Event) bool
		change func(dir *os.Root) error
	}{
		{"any event, a file made", nil, func(dir *os.Root) error { return dir.WriteFile("f", nil, 0o600) }},
		{"removals only, a directory removed", removed, func(dir *os.Root) error { return dir.Remove("pod") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, dir := watcher(t)
			if err := dir.Mkdir("pod", 0o700); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			calls, done := run(ctx, w, tc.want, nil, nil)
			if err := tc.change(dir); err != nil {
				t.Fatal(err)
			}
			evs := wait(t, calls, "call after the change")
			if len(evs) == 0 {
				t.Fatal("called with no events after a change")
			}
			for _, ev := range evs {
				if tc.want != nil && !tc.want(ev) {
					t.Errorf("called with %v, which want refuses", ev)
				}
			}
			cancel()
			if err := wait(t, done, "return after the context ended"); err != nil {
				t.Fatalf("Loop returned %v when its context ended, want nil", err)
			}
		})
	}
}

func TestLoopTicks(t *testing.T) {
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls, _ := run(ctx, nil, nil, tick, nil) // no watcher: the clock alone
	for range 2 {
		tick <- time.Now()
		if evs := wait(t, calls, "call at a tick"); evs != nil {
			t.Fatalf("called with %v at a tick, want nil (anything may have changed)", evs)
		}
	}
}

func TestLoopEnds(t *testing.T) {
	boom := errors.New("boom")
	t.Run("fn's error, as it is", func(t *testing.T) {
		tick := make(chan time.Time, 1)
		tick <- time.Now()
		_, done := run(context.Background(), nil, nil, tick, boom)
		if err := wait(t, done, "return"); !errors.Is(err, boom) {
			t.Fatalf("Loop returned %v, want fn's %v", err, boom)
		}
	})
	t.Run("watcher closed", func(t *testing.T) {
		w, _ := watcher(t)
		_, done := run(context.Background(), w, nil, nil, nil)
		_ = w.Close()
		if err := wait(t, done, "return"); err == nil {
			t.Fatal("Loop returned nil when its watcher was closed under it")
		}
	})
}
