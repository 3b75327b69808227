package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"crust.dev/crust/internal/recordfile"
)

// The watch revision record (see the package documentation).
const (
	revisionDir     = "watch"
	revisionFile    = "revision.json"
	revisionVersion = 1
	revisionField   = "revision"
)

// keptRevision is the payload of the watch revision record.
type keptRevision struct {
	Revision uint64 `json:"revision"`
	Stopped  bool   `json:"stopped"`
	State    string `json:"state,omitempty"`
}

// readRevision reads the watch revision record of d, as the package documentation says.
func readRevision(d *recordfile.Dir, bootID string, log *slog.Logger) keptRevision {
	dir := d.Extra(revisionDir)
	data, err := recordfile.Read(dir, revisionFile)
	if errors.Is(err, fs.ErrNotExist) {
		return keptRevision{}
	}
	var k keptRevision
	if err == nil {
		var rec recordfile.Record
		if rec, err = recordfile.Decode(data, revisionVersion, revisionVersion, revisionField); err == nil {
			err = json.Unmarshal(rec.Payload, &k)
			if err == nil && rec.BootID != bootID {
				log.Info("store: the watch revision was kept in another boot; revisions go on above it", "revision", k.Revision)
				if k.Stopped {
					k.Revision++ // issued: the revision after it never was
				}
				k.Stopped, k.State = false, ""
			}
		}
	}
	if err != nil {
		log.Warn("store: the watch revision record cannot be read; revisions start again from zero, and it is replaced",
			"file", dir.Join(revisionFile), "err", err)
		return keptRevision{}
	}
	return k
}

// KeptRevision returns the watch revision record as Open read it: the revision, whether it was kept at a
// clean stop, and the digest of the descriptors then (see internal/manager's Revisions).
func (s *Store) KeptRevision() (revision uint64, stopped bool, state string) {
	return s.kept.Revision, s.kept.Stopped, s.kept.State
}

// KeepRevision replaces the watch revision record, durably (see internal/manager's Revisions).
func (s *Store) KeepRevision(revision uint64, stopped bool, state string) error {
	payload, err := json.Marshal(keptRevision{Revision: revision, Stopped: stopped, State: state})
	if err != nil {
		return err
	}
	b, err := recordfile.Encode(revisionVersion, s.bootID, revisionField, payload)
	if err != nil {
		return err
	}
	if err := s.dir.WriteExtra(revisionDir, revisionFile, b); err != nil {
		return fmt.Errorf("store: keep the watch revision: %w", err)
	}
	return nil
}
