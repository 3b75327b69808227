package manager

import (
	"fmt"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// DefaultWatchBuffer is how many events a watcher may fall behind before it is cut off. A watcher that is
// cut off learns so from Err and starts again with send_existing, so nothing is lost, only re-sent.
const DefaultWatchBuffer = 1024

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
	m.watchers[w] = struct{}{}
	return w
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
			m.removeWatcher(w, fmt.Errorf("watcher fell %d events behind and was cut off; watch again with send_existing: %w",
				m.cfg.WatchBuffer, errdefs.ErrAborted))
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
