// Package dirwatch keeps something in step with a directory: it runs a function after the directory
// changes, once per burst of changes, and on a clock when one is given. An event is only a hint to look
// again: the function reads what it needs itself, so events lost (an inotify overflow) or merged cost
// nothing but a call, and no event ever carries a decision.
package dirwatch

import (
	"context"
	"errors"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Settle is how long Loop lets a burst of events go on before it calls: a file renamed into place, or
// several pods' directories removed at once, are several events and one call.
const Settle = 20 * time.Millisecond

// Loop calls fn Settle after the first of a burst of w's events that want accepts (nil accepts every
// event), with the burst's accepted events in the order they came. It calls fn with nil, meaning that
// anything may have changed, Settle after an error w reports (events were lost) and at each tick of
// tick, when tick is not nil; a tick takes in a burst still settling. A nil w has no events: only tick
// calls fn. Loop does not call fn when it starts. It returns nil when ctx ends, fn's error as it is, or
// an error when w is closed under it.
func Loop(ctx context.Context, w *fsnotify.Watcher, want func(fsnotify.Event) bool, tick <-chan time.Time, fn func([]fsnotify.Event) error) error {
	var (
		events <-chan fsnotify.Event
		errs   <-chan error
		timer  <-chan time.Time // running while a burst settles
		burst  []fsnotify.Event
		lost   bool // the burst lost events: fn is told that anything may have changed
	)
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	call := func() error {
		evs := burst
		if lost {
			evs = nil
		}
		timer, burst, lost = nil, nil, false
		return fn(evs)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return errClosed
			}
			if want == nil || want(ev) {
				burst = append(burst, ev)
				if timer == nil {
					timer = time.After(Settle)
				}
			}
		case _, ok := <-errs:
			if !ok {
				return errClosed
			}
			lost = true
			if timer == nil {
				timer = time.After(Settle)
			}
		case <-timer:
			if err := call(); err != nil {
				return err
			}
		case <-tick:
			lost = true
			if err := call(); err != nil {
				return err
			}
		}
	}
}

var errClosed = errors.New("fsnotify watcher closed")
