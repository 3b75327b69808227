// Package keylock serialises operations per key (a volume's target path) without a global lock: calls on
// different keys never wait for each other.
//
// A caller waits for a key at most as long as its context allows and at most the Locker's wait bound;
// past that it gets errdefs.ErrAborted, which the API reports as ABORTED ("operation already in flight"),
// the code CSI callers retry on. Nothing is held for a key nobody is using.
package keylock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"crust.dev/crust/api/errdefs"
)

// Locker hands out per-key locks. The zero value is not usable; call New.
type Locker struct {
	wait time.Duration

	mu    sync.Mutex
	slots map[string]*slot
}

type slot struct {
	ch   chan struct{} // holds one token while the key is locked
	refs int           // holders and waiters; the slot is dropped at zero
}

// New returns a Locker whose callers wait at most wait for a busy key (0 means: do not wait).
func New(wait time.Duration) *Locker {
	return &Locker{wait: wait, slots: map[string]*slot{}}
}

// Lock takes key's lock and returns the function that gives it back (call it exactly once). It fails
// with an error wrapping errdefs.ErrAborted when the key stays busy past the wait bound or the context
// ends first.
func (l *Locker) Lock(ctx context.Context, key string) (unlock func(), err error) {
	l.mu.Lock()
	s := l.slots[key]
	if s == nil {
		s = &slot{ch: make(chan struct{}, 1)}
		l.slots[key] = s
	}
	s.refs++
	l.mu.Unlock()

	select {
	case s.ch <- struct{}{}:
		return func() { <-s.ch; l.drop(key, s) }, nil
	default:
	}
	timer := time.NewTimer(l.wait)
	defer timer.Stop()
	select {
	case s.ch <- struct{}{}:
		return func() { <-s.ch; l.drop(key, s) }, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	l.drop(key, s)
	return nil, fmt.Errorf("%q: another operation on it is in flight: %w", key, errdefs.ErrAborted)
}

func (l *Locker) drop(key string, s *slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.refs--
	if s.refs == 0 {
		delete(l.slots, key)
	}
}

// Len reports how many keys are locked or waited for; for tests and metrics.
func (l *Locker) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.slots)
}
