package manager

import (
	"fmt"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// DefaultWatchBuffer is how many events a watcher may fall behind before it is cut off. A watcher that is
// cut off learns so from Err and resumes (WatchSince) or starts again with send_existing, so nothing is
// lost, only re-sent.
const DefaultWatchBuffer = 1024

// DefaultWatchHistory is how many of the latest events are kept for watches that resume (WatchSince):
// more than DefaultWatchBuffer, so that a watcher cut off for falling behind can resume after the last
// event it got.
const DefaultWatchHistory = 4096

// Watcher receives volume events in revision order. Stop it when done.
type Watcher struct {
	m      *Manager
	events chan *crustv1.WatchVolumesResponse
	err    error // set, under m.mu, before events is closed
}

// Watch starts a watcher. With sendExisting, the first events are an EVENT_TYPE_EXISTING for every stored
// volume and then EVENT_TYPE_SYNCED, taken at the same instant the watcher starts, so no change falls
// between the snapshot and the stream.
func (m *Manager) Watch(sendExisting bool) *Watcher {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.watchLocked(sendExisting)
}

// watchLocked is Watch, called with m.mu held.
func (m *Manager) watchLocked(sendExisting bool) *Watcher {
	n := m.cfg.WatchBuffer
	if sendExisting {
		n += len(m.vols) + 1
	}
	w := &Watcher{m: m, events: make(chan *crustv1.WatchVolumesResponse, n)}
	if sendExisting {
		for _, v := range m.vols {
			w.events <- &crustv1.WatchVolumesResponse{Type: crustv1.EventType_EVENT_TYPE_EXISTING, Volume: v, Revision: m.rev}
		}
		w.events <- &crustv1.WatchVolumesResponse{Type: crustv1.EventType_EVENT_TYPE_SYNCED, Revision: m.rev}
	}
	m.register(w)
	return w
}

// register makes w receive the events from now on; after EndWatches, it ends w at once instead. Called
// with m.mu held.
func (m *Manager) register(w *Watcher) {
	if m.watchesEnded {
		w.err = errStopping
		close(w.events)
		return
	}
	m.watchers[w] = struct{}{}
}

// errStopping ends the watchers of a crustd that is stopping.
var errStopping = errdefs.Errorf(errdefs.ErrUnavailable, "crustd is stopping; watch again once it is back, resuming "+
	"with since_revision (the revision of the last event received)")

// EndWatches ends every watcher, and every one started after it, with ErrUnavailable: crustd is
// stopping, and its server waits for the streams to end. The watchers resume once crustd is back
// (WatchSince: a clean stop keeps the revision, see Close).
func (m *Manager) EndWatches() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watchesEnded = true
	for w := range m.watchers {
		m.removeWatcher(w, errStopping)
	}
}

// WatchSince starts a watcher that resumes after revision since: its first events are those issued after
// since, as they were sent then, and then EVENT_TYPE_SYNCED with resumed set and the current revision,
// taken at the same instant the watcher starts. When the events after since are no longer kept (since is
// older than the oldest revision a watch resumes after: the history holds the last WatchHistory events,
// none from before Open but for a clean stop's, see Revisions) or since was never issued (it is above the
// current revision), it is ErrOutOfRange naming the oldest revision a watch resumes after; with
// orExisting it is Watch(true) instead, whose EVENT_TYPE_SYNCED has resumed unset.
func (m *Manager) WatchSince(since uint64, orExisting bool) (*Watcher, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.resumable(since); err != nil {
		if orExisting {
			return m.watchLocked(true), nil
		}
		return nil, err
	}
	// The history holds every event after resumeFrom, in order; those after since are its tail.
	h := m.revs.history
	i := len(h)
	for i > 0 && h[i-1].GetRevision() > since {
		i--
	}
	replay := h[i:]
	w := &Watcher{m: m, events: make(chan *crustv1.WatchVolumesResponse, m.cfg.WatchBuffer+len(replay)+1)}
	for _, ev := range replay {
		w.events <- ev
	}
	w.events <- &crustv1.WatchVolumesResponse{Type: crustv1.EventType_EVENT_TYPE_SYNCED, Revision: m.rev, Resumed: true}
	m.register(w)
	return w, nil
}

// resumable says why a watch cannot resume after revision since, or nil. Called with m.mu held.
func (m *Manager) resumable(since uint64) error {
	const again = "watch with send_existing to list the volumes again, then resume from the revision of its EVENT_TYPE_SYNCED"
	switch {
	case since > m.rev:
		return fmt.Errorf("watch since revision %d: crustd has issued revisions up to %d only (that one is from a crustd "+
			"whose state directory has been emptied since, or not one crustd sent); it resumes after revisions %d to %d; %s: %w",
			since, m.rev, m.revs.resumeFrom, m.rev, again, errdefs.ErrOutOfRange)
	case since < m.revs.resumeFrom:
		why := fmt.Sprintf("crustd keeps the last %d changes only", m.cfg.WatchHistory)
		if m.revs.resumeFrom == m.revs.start {
			why = fmt.Sprintf("crustd started at revision %d and does not know the changes before it", m.revs.start)
		}
		return fmt.Errorf("watch since revision %d: %s; it resumes after revisions %d to %d; %s: %w",
			since, why, m.revs.resumeFrom, m.rev, again, errdefs.ErrOutOfRange)
	}
	return nil
}

// Events is closed when the watcher stops or is cut off; Err then says why.
func (w *Watcher) Events() <-chan *crustv1.WatchVolumesResponse { return w.events }

// Err is nil after Stop, or the reason the watcher was cut off.
func (w *Watcher) Err() error {
	w.m.mu.RLock()
	defer w.m.mu.RUnlock()
	return w.err
}

// Stop ends the watcher; calling it again does nothing.
func (w *Watcher) Stop() {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	w.m.removeWatcher(w, nil)
}

// broadcast sends ev to every watcher without blocking. Called with m.mu held.
func (m *Manager) broadcast(ev *crustv1.WatchVolumesResponse) {
	for w := range m.watchers {
		select {
		case w.events <- ev: // events and volumes are never mutated once sent
		default:
			m.removeWatcher(w, fmt.Errorf("watcher fell %d events behind and was cut off; resume with since_revision (the "+
				"revision of the last event received), or watch again with send_existing: %w", m.cfg.WatchBuffer, errdefs.ErrAborted))
		}
	}
}

func (m *Manager) removeWatcher(w *Watcher, err error) {
	if _, ok := m.watchers[w]; !ok {
		return
	}
	delete(m.watchers, w)
	w.err = err
	close(w.events)
}
