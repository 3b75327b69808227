package csiproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"crust.dev/crust/internal/dirlock"
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

// Phase is how far a call got. See the package documentation for the order.
type Phase string

// Phases.
const (
	PhasePublishing        Phase = "publishing"
	PhaseDriverPublished   Phase = "driver-published"
	PhaseDeposited         Phase = "deposited"
	PhaseMounted           Phase = "mounted"
	PhasePublished         Phase = "published"
	PhaseUnpublishing      Phase = "unpublishing"
	PhaseUndeposited       Phase = "undeposited"
	PhaseUnmounted         Phase = "unmounted"
	PhaseDriverUnpublished Phase = "driver-unpublished"
	PhaseStaging           Phase = "staging"
	PhaseStaged            Phase = "staged"
	PhaseUnstaging         Phase = "unstaging"
	// PhaseForgotten is never stored: it names the instant after a record was deleted, for the hook.
	PhaseForgotten Phase = "forgotten"
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

var errNewerVersion = recordfile.ErrNewerVersion

// recordKey is the file name key of a record.
func recordKey(k Kind, path string) string {
	sum := sha256.Sum256([]byte(string(k) + ":" + path))
	return hex.EncodeToString(sum[:])
}

// state is the crash-safe record store with an in-memory index. Calls for one path must be serialised by
// the caller; different paths may be used concurrently.
type state struct {
	dir, records, tmp, corrupt, block string
	bootID                            string

	lock *dirlock.Lock // held while the state is open

	mu  sync.Mutex
	idx map[string]*Record // by recordKey
}

// close releases the state directory for another process.
func (s *state) close() { s.lock.Release() }

// openState creates the directories, empties tmp/, and loads the records as the package doc describes.
func openState(dir, bootID string, log *slog.Logger) (*state, error) {
	s := &state{
		dir: dir, bootID: bootID,
		records: filepath.Join(dir, "records"), tmp: filepath.Join(dir, "tmp"),
		corrupt: filepath.Join(dir, "corrupt"), block: filepath.Join(dir, "block"),
		idx: map[string]*Record{},
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	// One proxy per state directory: a second one fails at once, naming the first.
	lock, err := dirlock.Acquire(dir, "crust-csi-proxy")
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	s.lock = lock
	ok := false
	defer func() {
		if !ok {
			lock.Release()
		}
	}()
	for _, d := range []string{s.records, s.tmp, s.corrupt, s.block} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	if err := recordfile.SyncDir(dir); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	tmps, err := os.ReadDir(s.tmp)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	for _, e := range tmps {
		_ = os.RemoveAll(filepath.Join(s.tmp, e.Name()))
	}
	entries, err := os.ReadDir(s.records)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	type bad struct{ name, reason string }
	var damaged []bad
	for _, e := range entries {
		name := e.Name()
		r, err := readRecordFile(filepath.Join(s.records, name), bootID)
		switch {
		case errors.Is(err, errNewerVersion):
			return nil, fmt.Errorf("state: %s: %w; refusing to start so that a downgrade loses nothing",
				filepath.Join(s.records, name), err)
		case err != nil:
			damaged = append(damaged, bad{name, err.Error()})
			continue
		}
		if want := recordKey(r.Kind, r.Path) + ".json"; name != want {
			damaged = append(damaged, bad{name, "file name does not match kind and path"})
			continue
		}
		if r.Stale {
			log.Info("state: record of an earlier boot; its mounts are gone, the next call on the path redoes or undoes it",
				"kind", r.Kind, "path", r.Path, "phase", r.Phase)
		}
		s.idx[recordKey(r.Kind, r.Path)] = r
	}
	now := time.Now().UTC().Format("20060102T150405.000000000Z")
	for _, b := range damaged {
		to := filepath.Join(s.corrupt, b.name+"."+now)
		log.Error("state: moving a damaged record aside; what it recorded may need cleaning up by hand",
			"file", filepath.Join(s.records, b.name), "to", to, "reason", b.reason)
		if err := os.Rename(filepath.Join(s.records, b.name), to); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	if len(damaged) > 0 {
		if err := recordfile.SyncDir(s.records); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	ok = true
	return s, nil
}

// readRecordFile reads and verifies one record file.
func readRecordFile(path, bootID string) (*Record, error) {
	b, err := recordfile.Read(path)
	if err != nil {
		return nil, err
	}
	return decodeRecord(b, bootID)
}

// decodeRecord verifies and decodes the bytes of one record file; a record of another boot is marked
// stale.
func decodeRecord(b []byte, bootID string) (*Record, error) {
	recBoot, payload, err := recordfile.Decode(b, recordVersion, payloadField)
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&r); err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	if r.Path == "" || (r.Kind != KindPublish && r.Kind != KindStage) {
		return nil, errors.New("payload has no path or an unknown kind")
	}
	r.Stale = recBoot != bootID
	return &r, nil
}

// get returns a copy of the record of (k, path), or nil.
func (s *state) get(k Kind, path string) *Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.idx[recordKey(k, path)]
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// list returns copies of every record, sorted by kind and path.
func (s *state) list() []Record {
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

// put makes r durable (with this boot's id) and indexes it. r.Updated is set.
func (s *state) put(r *Record) error {
	r.Updated = time.Now().UTC()
	r.Stale = false
	payload, err := json.Marshal(r)
	if err != nil {
		return err
	}
	data, err := recordfile.Encode(recordVersion, s.bootID, payloadField, payload)
	if err != nil {
		return err
	}
	key := recordKey(r.Kind, r.Path)
	if err := recordfile.Write(s.records, s.tmp, key+".json", data); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	c := *r
	s.mu.Lock()
	s.idx[key] = &c
	s.mu.Unlock()
	return nil
}

// delete removes the record of (k, path) durably; an unknown one is not an error.
func (s *state) delete(k Kind, path string) error {
	key := recordKey(k, path)
	if err := os.Remove(filepath.Join(s.records, key+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("state: %w", err)
	}
	if err := recordfile.SyncDir(s.records); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	s.mu.Lock()
	delete(s.idx, key)
	s.mu.Unlock()
	return nil
}

// privateDir is the directory holding the private block path of a target path.
func (s *state) privateDir(target string) string {
	return filepath.Join(s.block, recordKey(KindPublish, target))
}
