package csiproxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/recordfile"
)

// stageKeys holds the encryption keys that came with NodeStageVolume's secrets (a StorageClass's
// node-stage secret), by staging path, for the publishes of those volumes, whose own secrets lack one.
// A key is acknowledged with its stage, so it must outlive a restart of the proxy: it is kept as crustd
// keeps its records, in a record directory (see internal/recordfile: mode 0600 files under 0700
// directories, atomic, links never followed) that lies on tmpfs, never on a disk, until its volume is
// unstaged; a key of an earlier boot is dropped, as kubelet stages again after a reboot. When the
// directory is not on tmpfs (or no directory is given) keys are kept in memory only, as before: a proxy
// restarted between stage and publish has lost them, and the publish is refused saying so.
type stageKeys struct {
	mu  sync.Mutex
	m   map[string]string
	dir *recordfile.Dir // nil: memory only
}

// stageKeyRecord is the payload of a kept key's record.
type stageKeyRecord struct {
	Path string `json:"path"`
	Key  string `json:"key"`
}

// tmpfsMagic and ramfsMagic are the statfs(2) f_type of the filesystems that never reach a disk.
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// openStageKeys opens the key directory dir and loads the keys of this boot; "" keeps keys in memory
// only, and so does a directory that is not on tmpfs (logged at Warn, since such a key would reach a
// disk).
func openStageKeys(dir, bootID string, log *slog.Logger) (*stageKeys, error) {
	k := &stageKeys{m: map[string]string{}}
	if dir == "" {
		return k, nil
	}
	if err := ensureTmpfs(dir); err != nil {
		log.Warn("encryption keys of stages are kept in memory only, and lost at a restart of the proxy", "stage_key_dir", dir, "why", err)
		return k, nil
	}
	var mu sync.Mutex
	d, err := openRecords("--stage-key-dir", dir, recordfile.Options{Version: 1, Field: "stage_key", BootID: bootID,
		Records: "keys", Log: log}, func(l recordfile.Loaded) (bool, error) {
		if l.BootID != bootID {
			return true, nil
		}
		var r stageKeyRecord
		if err := json.Unmarshal(l.Payload, &r); err != nil || r.Path == "" {
			return false, fmt.Errorf("not a stage key record: %v", err)
		}
		if l.Name != stageKeyName(r.Path) {
			return false, errors.New("file name does not match the staging path")
		}
		mu.Lock()
		k.m[r.Path] = r.Key
		mu.Unlock()
		return false, nil
	}, "stage keys: damaged records were moved aside; their volumes' publishes are refused until staged again")
	if err != nil {
		return nil, err
	}
	k.dir = d
	return k, nil
}

// ensureTmpfs makes dir (mode 0700, and its missing parents) when missing and says why it is not on
// tmpfs or ramfs, or nil.
func ensureTmpfs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if st.Type != tmpfsMagic && st.Type != ramfsMagic {
		return fmt.Errorf("%s is on a filesystem of type %#x, not tmpfs", dir, st.Type)
	}
	return nil
}

// stageKeyName is the record file name of the key of the stage at path: a hash, as a path may be longer
// than a file name.
func stageKeyName(path string) string {
	sum := sha256.Sum256([]byte(path))
	return hex.EncodeToString(sum[:]) + ".json"
}

// close gives up the key directory.
func (k *stageKeys) close() {
	if k.dir != nil {
		k.dir.Close()
	}
}

// stageKey returns the key in a stage's secrets when its volume context asks for encryption, "" when it
// asks for none or the secrets hold no key; a key that is there but unusable (empty, too long) is an
// InvalidArgument naming the secret's entry.
func stageKey(volCtx, secrets map[string]string) (string, error) {
	if enc, err := volume.ParseEncryption(volCtx); err != nil || enc == nil {
		return "", err
	}
	if _, given := secrets[volume.EncryptionSecretKey]; !given {
		return "", nil
	}
	return volume.EncryptionKeyFrom(secrets)
}

// set keeps key for the volume staged at path, durably when the key directory is on tmpfs.
func (k *stageKeys) set(path, key string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dir != nil {
		b, err := json.Marshal(stageKeyRecord{Path: path, Key: key})
		if err != nil {
			return err
		}
		if err := k.dir.Put(stageKeyName(path), b); err != nil {
			return fmt.Errorf("keep the stage's encryption key: %w", err)
		}
	}
	k.m[path] = key
	return nil
}

// forget drops the key of the volume staged at path.
func (k *stageKeys) forget(path string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dir != nil {
		if err := k.dir.Delete(stageKeyName(path)); err != nil {
			return fmt.Errorf("forget the stage's encryption key: %w", err)
		}
	}
	delete(k.m, path)
	return nil
}

// get returns the key given at the stage of path, if any; a nil stageKeys holds none.
func (k *stageKeys) get(path string) (string, bool) {
	if k == nil {
		return "", false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok := k.m[path]
	return key, ok
}

// defaultStageKeyDir is where a proxy keeps its stage keys unless told: beside crustd's socket, on the
// node's /run (tmpfs), in a directory of its own named after its state directory, since one proxy runs
// per driver.
func defaultStageKeyDir(crustSocket, stateDir string) string {
	sock := strings.TrimPrefix(strings.TrimPrefix(crustSocket, "unix://"), "unix:")
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return filepath.Join(filepath.Dir(sock), "csi-proxy-keys", hex.EncodeToString(sum[:8]))
}
