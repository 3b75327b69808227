package csiproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"crust.dev/crust/internal/recordfile"
)

// recordVersion is the record format this code writes and the newest it reads.
const recordVersion = 1

// payloadField is the envelope's key for the record.
const payloadField = "record"

// Kind says what kind of path a record is about.
type Kind string

// Record kinds.
const (
	KindPublish Kind = "publish" // a NodePublishVolume target path
	KindStage   Kind = "stage"   // a NodeStageVolume staging path
)

// Mode says what the proxy does with a path.
type Mode string

// Modes.
const (
	ModeDeferred   Mode = "deferred"    // descriptor deposited with crustd, target left an empty directory
	ModeHost       Mode = "host"        // formatted and mounted on the host by the proxy
	ModeBlockStage Mode = "block-stage" // staged by the driver as raw block
)

// Phase is how far a call got: whether it completed, or is being made or undone. See the package
// documentation for the order.
type Phase string

// Phases.
const (
	PhasePublishing   Phase = "publishing"
	PhasePublished    Phase = "published"
	PhaseUnpublishing Phase = "unpublishing"
	PhaseStaging      Phase = "staging"
	PhaseStaged       Phase = "staged"
	PhaseUnstaging    Phase = "unstaging"
)

// Record is what the proxy remembers of one path.
type Record struct {
	Kind        Kind      `json:"kind"`
	Path        string    `json:"path"`
	VolumeID    string    `json:"volumeId"`
	Mode        Mode      `json:"mode"`
	Phase       Phase     `json:"phase"`
	StagingPath string    `json:"stagingPath,omitempty"`
	PrivatePath string    `json:"privatePath,omitempty"`
	Device      string    `json:"device,omitempty"`
	FsType      string    `json:"fsType,omitempty"`
	ReadOnly    bool      `json:"readOnly,omitempty"`
	Updated     time.Time `json:"updated"`

	// Stale is true for a record written under another boot id (not stored).
	Stale bool `json:"-"`
}

// recordKey is the file name key of a record.
func recordKey(k Kind, path string) string {
	sum := sha256.Sum256([]byte(string(k) + ":" + path))
	return hex.EncodeToString(sum[:])
}

// Journal is where the proxy records how far each call on a path got, so that a restarted proxy finishes
// or undoes it. The proxy calls it for one path at a time; different paths may be used concurrently.
type Journal interface {
	// Get returns a copy of the record of (k, path), or nil.
	Get(k Kind, path string) *Record
	// List returns copies of every record, sorted by kind and path.
	List() []Record
	// Put makes r durable before it returns; it sets r.Updated and clears r.Stale.
	Put(r *Record) error
	// Delete forgets the record of (k, path) durably before it returns; an unknown one is not an error.
	Delete(k Kind, path string) error
	// PrivateDir is the directory that holds the private block path of a target path.
	PrivateDir(target string) string
	// Close releases the journal for another process.
	Close()
}

// state is the Journal OpenJournal opens: records in a record directory (internal/recordfile) with an
// in-memory index.
type state struct {
	block string          // path of the directory holding the private publish paths handed to the driver
	dir   *recordfile.Dir // records/, tmp/, corrupt/, block/ under the state directory, which it locks

	mu  sync.Mutex
	idx map[string]*Record // by recordKey
}

// Close releases the state directory for another process.
func (s *state) Close() { s.dir.Close() }

// OpenJournal locks the state directory (one proxy per directory: a second one fails at once, naming the
// first), creates its subdirectories, empties tmp/ and loads the records, as the package doc describes.
// The state directory must be ours and writable by us alone, and neither it nor its subdirectories may be
// symbolic links; every record operation is relative to the opened directories and never follows a link.
//
// A record of an earlier boot is kept, marked Stale: unlike crustd's descriptors, which describe what a
// running VM may use and mean nothing after a reboot, a record here is an obligation to undo (the driver's
// publish or stage, a private path) that a reboot does not discharge.
func OpenJournal(dir, bootID string, log *slog.Logger) (Journal, error) {
	return openState(dir, bootID, log)
}

func openState(dir, bootID string, log *slog.Logger) (*state, error) {
	s := &state{block: filepath.Join(dir, "block"), idx: map[string]*Record{}}
	var mu sync.Mutex // the check runs on several goroutines
	check := func(l recordfile.Loaded) (bool, error) {
		r, err := decodePayload(l.Payload)
		if err != nil {
			return false, err
		}
		key := recordKey(r.Kind, r.Path)
		if l.Name != key+".json" {
			return false, errors.New("file name does not match kind and path")
		}
		if r.Stale = l.BootID != bootID; r.Stale {
			log.Info("state: record of an earlier boot; its mounts are gone, the next call on the path redoes or undoes it",
				"kind", r.Kind, "path", r.Path, "phase", r.Phase)
		}
		mu.Lock()
		s.idx[key] = r
		mu.Unlock()
		return false, nil
	}
	d, err := openRecords("--state-dir", dir, recordfile.Options{
		Version: recordVersion, Field: payloadField, BootID: bootID,
		Records: "records", Extra: []string{"block"}, Log: log,
	}, check, "state: damaged records were moved aside; what they recorded may need cleaning up by hand")
	if err != nil {
		return nil, err
	}
	s.dir = d
	return s, nil
}

// openRecords opens the proxy's record directory dir, named by its flag in errors, with check (see
// recordfile.Open), and logs the damaged records moved aside at Error with damaged.
func openRecords(flag, dir string, opt recordfile.Options, check recordfile.Check, damaged string) (*recordfile.Dir, error) {
	opt.Holder = "crust-csi-proxy"
	d, report, err := recordfile.Open(dir, opt, check)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if len(report.Corrupt) > 0 && opt.Log != nil {
		opt.Log.Error(damaged, "files", report.Corrupt)
	}
	return d, nil
}

// decodeRecord verifies and decodes the bytes of one record file; a record of another boot is marked
// stale.
func decodeRecord(b []byte, bootID string) (*Record, error) {
	rec, err := recordfile.Decode(b, recordVersion, recordVersion, payloadField)
	if err != nil {
		return nil, err
	}
	r, err := decodePayload(rec.Payload)
	if err != nil {
		return nil, err
	}
	r.Stale = rec.BootID != bootID
	return r, nil
}

// decodePayload decodes and checks a record's payload.
func decodePayload(payload []byte) (*Record, error) {
	var r Record
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&r); err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	if r.Path == "" || (r.Kind != KindPublish && r.Kind != KindStage) {
		return nil, errors.New("payload has no path or an unknown kind")
	}
	return &r, nil
}

// Get returns a copy of the record of (k, path), or nil.
func (s *state) Get(k Kind, path string) *Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.idx[recordKey(k, path)]
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// List returns copies of every record, sorted by kind and path.
func (s *state) List() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Record, 0, len(s.idx))
	for _, r := range s.idx {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Path < out[j].Path
	})
	return out
}

// Put makes r durable (with this boot's id) and indexes it. r.Updated is set.
func (s *state) Put(r *Record) error {
	r.Updated = time.Now().UTC()
	r.Stale = false
	payload, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := recordKey(r.Kind, r.Path)
	if err := s.dir.Put(key+".json", payload); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	c := *r
	s.mu.Lock()
	s.idx[key] = &c
	s.mu.Unlock()
	return nil
}

// Delete removes the record of (k, path) durably; an unknown one is not an error.
func (s *state) Delete(k Kind, path string) error {
	key := recordKey(k, path)
	if err := s.dir.Delete(key + ".json"); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	s.mu.Lock()
	delete(s.idx, key)
	s.mu.Unlock()
	return nil
}

// PrivateDir is the directory holding the private block path of a target path.
func (s *state) PrivateDir(target string) string {
	return filepath.Join(s.block, recordKey(KindPublish, target))
}
