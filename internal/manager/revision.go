package manager

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// How revisions survive a restart (Revisions). Writing the counter at every change would double what a
// change costs the disk, so it is kept in three moments instead:
//
//   - At Open, and whenever the revision reaches what was kept, a ceiling: a revision RevisionBlock above
//     the current one, which no revision of this run reaches before a new ceiling is kept. After a crash
//     the next Open goes on from the ceiling: above every revision issued, never one issued twice, and no
//     watch from before resumes (the changes between its revision and the crash are not known).
//   - At Close (a clean stop), the last revision issued with a digest of the descriptors held. The next
//     Open goes on from it when it loads the same descriptors, so a watcher that had every change resumes
//     across the restart; when they differ (another program changed the state directory meanwhile) it
//     goes on from the revision after it, from which no watch from before resumes.
//   - A change made after Close takes the clean stop back: a ceiling is kept again.

// RevisionBlock is how far above the current revision the ceiling Revisions keeps lies; a run issues
// that many revisions between two writes of it.
const RevisionBlock = 4096

// revisions is what the manager knows of its revision counter beyond the counter itself. It is guarded
// by the manager's mu.
type revisions struct {
	ceiling uint64 // kept with Revisions: every revision issued is below it
	stopped bool   // Close kept the current revision as the last one
	start   uint64 // the revision at Open
	// resumeFrom is the oldest revision a watch resumes after: the revision at Open, or that of the
	// latest event history dropped.
	resumeFrom uint64
	// history are the latest events, oldest first: at most Config.WatchHistory.
	history []*crustv1.WatchVolumesResponse
}

// openRevisions sets the revision counter from what Revisions kept (see above) and keeps a ceiling. It
// is called by Open once the descriptors loaded are held.
func (m *Manager) openRevisions() {
	if m.cfg.Revisions == nil {
		return
	}
	kept, stopped, state := m.cfg.Revisions.KeptRevision()
	switch {
	case stopped && state != "" && state == stateDigest(m.vols):
		m.rev = kept
		m.log.Info("revisions go on from the last one of crustd's clean stop; watches resume across the restart", "revision", kept)
	case stopped:
		m.rev = kept + 1
		m.log.Info("the descriptors are not those crustd held at its stop; watches from before the restart do not resume",
			"stopped_at", kept, "revision", m.rev)
	default:
		m.rev = kept
		if kept > 0 {
			m.log.Info("crustd did not stop cleanly; revisions go on above every one issued, and watches from before "+
				"the restart do not resume", "revision", kept)
		}
	}
	m.revs.start, m.revs.resumeFrom = m.rev, m.rev
	if err := m.reserve(); err != nil {
		// Not a reason not to start (reads are answered, and a change fails at the store all the same);
		// each change tries again (keepRevision).
		m.log.Error("keep the watch revision's ceiling; until it is kept, a crash may let a revision be issued twice",
			"revision", m.rev, "err", err)
	}
}

// keepRevision keeps a new ceiling when the revision reached the one kept, or when Close kept the
// revision before this change as the last one. Called with m.mu held, before the revision is issued.
func (m *Manager) keepRevision() {
	if m.cfg.Revisions == nil || (m.rev < m.revs.ceiling && !m.revs.stopped) {
		return
	}
	if err := m.reserve(); err != nil {
		// The change is durable and is acknowledged; only a crash before the next write would let a
		// revision be issued twice. Each change tries again.
		m.log.Error("keep the watch revision's ceiling", "revision", m.rev, "err", err)
	}
}

// reserve keeps a ceiling RevisionBlock above the current revision.
func (m *Manager) reserve() error {
	ceiling := m.rev + RevisionBlock
	if err := m.cfg.Revisions.KeepRevision(ceiling, false, ""); err != nil {
		return err
	}
	m.revs.ceiling, m.revs.stopped = ceiling, false
	return nil
}

// Close keeps the current revision as the last one, with a digest of the descriptors held, so that the
// next Open goes on from it and watches resume across the restart. Call it once nothing changes any more
// (the server has stopped, the background loops have ended); a change made after it takes it back (a
// ceiling is kept, as after a crash). Watchers are not stopped. Without Revisions it does nothing.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.Revisions == nil {
		return nil
	}
	state := stateDigest(m.vols)
	if state == "" {
		return m.reserve()
	}
	if err := m.cfg.Revisions.KeepRevision(m.rev, true, state); err != nil {
		return err
	}
	m.revs.stopped = true
	return nil
}

// Revision returns the current revision and the oldest one a watch resumes after (WatchSince).
func (m *Manager) Revision() (current, resumeFrom uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.rev, m.revs.resumeFrom
}

// remember keeps ev, just issued, for watches that resume. Called with m.mu held.
func (m *Manager) remember(ev *crustv1.WatchVolumesResponse) {
	h := append(m.revs.history, ev)
	if n := len(h) - m.cfg.WatchHistory; n > 0 {
		m.revs.resumeFrom = h[n-1].GetRevision()
		h = h[n:]
	}
	m.revs.history = h
}

// stateDigest is the hex SHA-256 of the descriptors held, in target path order, each as its length and
// its deterministic protobuf encoding: equal for the same descriptors, whatever their order in memory;
// "" when one does not encode (never kept as a clean stop's).
func stateDigest(vols map[string]*crustv1.Volume) string {
	h := sha256.New()
	opt := proto.MarshalOptions{Deterministic: true}
	var buf []byte
	for _, t := range slices.Sorted(maps.Keys(vols)) {
		var err error
		buf, err = opt.MarshalAppend(buf[:0], vols[t])
		if err != nil {
			return ""
		}
		_, _ = h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(buf))))
		_, _ = h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}
