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
	"crust.dev/crust/pkg/safedir"
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
	dir, block   string       // paths: block holds the private publish paths handed to the driver
	records, tmp *safedir.Dir // opened once; every record operation is relative to them
	bootID       string

	lock *dirlock.Lock // held while the state is open

	mu  sync.Mutex
	idx map[string]*Record // by recordKey
}

// close releases the state directory for another process. The record directories stay open (a put
// racing the shutdown fails no worse than before); the process is ending.
func (s *state) close() { s.lock.Release() }

// openState creates the directories, empties tmp/, and loads the records as the package doc describes.
// The state directory must be ours and writable by us alone, and neither it nor its subdirectories may be
// symbolic links (see safedir.OpenOwned); every record operation is relative to the opened directories
// and never follows a link.
func openState(dir, bootID string, log *slog.Logger) (*state, error) {
	s := &state{dir: dir, bootID: bootID, block: filepath.Join(dir, "block"), idx: map[string]*Record{}}
	// One proxy per state directory: a second one fails at once, naming the first. Acquire also creates
	// dir and checks its owner and mode.
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
	root, err := safedir.OpenOwned(dir)
	if err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	defer func() { _ = root.Close() }()
	var subs [4]*safedir.Dir
	for i, name := range []string{"records", "tmp", "corrupt", "block"} {
		if subs[i], err = root.EnsureDir(name, 0o700); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	s.records, s.tmp = subs[0], subs[1]
	corrupt := subs[2]
	defer func() { _, _ = corrupt.Close(), subs[3].Close() }()
	if err := root.Sync(); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	tmps, err := s.tmp.Names()
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	for _, name := range tmps {
		_ = s.tmp.RemoveAll(name)
	}
	entries, err := s.records.Names()
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	type bad struct{ name, reason string }
	var damaged []bad
	for _, name := range entries {
		r, err := readRecordFile(s.records, name, bootID)
		switch {
		case errors.Is(err, errNewerVersion):
			return nil, fmt.Errorf("state: %s: %w; refusing to start so that a downgrade loses nothing",
				s.records.Join(name), err)
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
		to := b.name + "." + now
		log.Error("state: moving a damaged record aside; what it recorded may need cleaning up by hand",
			"file", s.records.Join(b.name), "to", corrupt.Join(to), "reason", b.reason)
		if err := s.records.Rename(b.name, corrupt, to); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	if len(damaged) > 0 {
		if err := errors.Join(corrupt.Sync(), s.records.Sync()); err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
	}
	ok = true
	return s, nil
}

// readRecordFile reads and verifies the record file name of dir (never through a link).
func readRecordFile(dir *safedir.Dir, name, bootID string) (*Record, error) {
	b, err := recordfile.Read(dir, name)
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
	if err := s.records.Remove(key + ".json"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("state: %w", err)
	}
	if err := s.records.Sync(); err != nil {
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
