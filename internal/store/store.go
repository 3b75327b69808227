// Package store is crustd's crash-safe persistence of volume descriptors (*crustv1.Volume), one record
// per target path (Volume.Spec.VolumeTargetPath). It knows nothing of gRPC or Kata, and it keeps no index:
// the caller holds the descriptors in memory, calls Put and Delete to make changes durable, and calls Open
// once at start to read back what survived.
//
// The records are kept by the record engine, internal/recordfile, whose package documentation is the
// contract of the state directory: the record format (version, boot id, checksum), the atomic and
// durable replace, file modes, the quarantine of a damaged record in corrupt/, the refusal of a newer
// version, links never followed, and the lock that gives the directory to one crustd at a time (a second
// one fails naming the first: Open takes it for the holder "crustd", Close gives it up). This package
// adds only what crustd keeps in it:
//
//   - Records: <dir>/volumes/<key>.json, one per target path, where <key> is the lowercase hex SHA-256 of
//     the target path's bytes (a hash, because a target path may be longer than NAME_MAX). The envelope's
//     payload member is "volume".
//   - A record of another boot is deleted at Open and its target path reported in LoadReport.Dropped: a
//     descriptor says what a running VM may use, and no VM survives a reboot.
//   - A payload that is not a Volume in its version's encoding, a Volume without a target path, or a file
//     name that is not <key of its target path>.json is damage: moved aside, reported in
//     LoadReport.Corrupt.
//   - A Volume with unstage_time set is not a descriptor but a claim kept after its volume was unstaged
//     (internal/manager says what it reserves). A crustd older than that field reads it as a claimed
//     descriptor: the reservation holds, and the descriptor shows until it is garbage-collected.
//   - A Volume with node_hold set is not a descriptor but the node's hold on a device (internal/manager
//     says what it reserves). A crustd older than that field reads it as an unclaimed descriptor of a block
//     device: it reserves nothing there, and shows until it is garbage-collected.
//   - Put and Delete are idempotent. They are safe to call concurrently for different target paths; calls
//     for one target path must be serialised by the caller.
//   - The watch revision: <dir>/watch/revision.json, one record (its own record version 1, payload member
//     "revision") whose payload is {"revision":N,"stopped":true|false,"state":"<hex>"}: what the manager
//     keeps of its revision counter (KeepRevision, KeptRevision; internal/manager says what the values
//     mean). A record of another boot is read as not stopped: a revision above every one issued, never a
//     point a watch resumes from. A missing record is revision zero, not stopped; one that cannot be read
//     is logged at Warn and read as missing (and replaced at the manager's first KeepRevision). An
//     older crustd leaves watch/ alone.
//
// # Record versions
//
// This code reads versions 1 and 2 (OldestVersion, NewestVersion); their payloads:
//
//   - 2: a JSON string holding the standard base64 (RFC 4648, padded) of the protobuf binary encoding of
//     crust.v1.Volume: a start decodes thousands, and the binary decodes several times faster than JSON.
//   - 1: the proto3 JSON encoding (protojson) of crust.v1.Volume.
//
// Neither encoding is byte-stable across builds, which is why the engine's checksum is over the stored
// bytes. Unknown fields in the payload are ignored (an unknown enum value is dropped in version 1 and kept
// as its number in version 2): a newer crustd may add fields to Volume within a record version, and an
// older crustd must still load the descriptor rather than lose the volume.
//
// Which version is written. crustd before record version 2 (the v0.1.0 images) reads version 1 alone and
// refuses to start on a record of version 2. So the version written is a setting (Options.WriteVersion,
// crustd's --store-write-version), as the storage version of a Kubernetes API server is: by default
// (DefaultWriteVersion) the newest version the previous release reads, 1 until v0.3.0, whose previous
// release (v0.2.0) reads 2; then the default moves to 2, and --store-write-version=1 keeps what a rollback
// to v0.1.0 needs. A record is read in whatever version it is, and written in the write version at its
// next Put; Open rewrites at once (logged at Info with their number) the records of this boot in a
// version newer than the write version, so that after a restart with --store-write-version=1 the previous
// release can be rolled back to. Records of an earlier boot are dropped anyway. `crustctl get -o json` and
// `crustctl ls -o json` show the descriptors crustd holds as JSON.
package store

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/recordfile"
)

// holder names crustd in the lock of its state directory (see recordfile).
const holder = "crustd"

// Store persists descriptors under one directory, which it holds from Open to Close. Create it with
// Open.
type Store struct {
	dir     *recordfile.Dir
	version int // the record format version Put writes
	bootID  string
	kept    keptRevision // the watch revision record as Open read it
}

// Options are Open's settings beyond the directory and the boot id; the zero value is the default.
type Options struct {
	// WriteVersion is the record format version Put writes, from OldestVersion to NewestVersion; 0 means
	// DefaultWriteVersion. Records of every version from OldestVersion to NewestVersion are read whatever
	// it is.
	WriteVersion int
	// Log receives what Open cleans up, drops and moves aside; nil means slog.Default().
	Log *slog.Logger
}

// LoadReport is what Open found.
type LoadReport struct {
	// Volumes are the valid records of this boot, sorted by target path.
	Volumes []*crustv1.Volume
	// Dropped are the target paths of valid records of another boot, sorted; their files were deleted.
	Dropped []string
	// Corrupt are the paths, in <dir>/corrupt, of the files moved aside, sorted.
	Corrupt []string
}

// Open takes dir (recordfile.Open: its lock, its checks, its clean-up after a crash) and loads the
// records, as the package documentation describes. bootID is the current boot's id (see
// recordfile.ReadBootID); records are written with it, and records with another one are dropped. A nil
// log means slog.Default().
//
// Open fails as recordfile.Open does: with errdefs.ErrFailedPrecondition, having changed nothing, on a
// directory another process holds (wrapping recordfile.ErrHeld), one that may not be worked in, or a
// record of a newer format version; on I/O errors, rewriting a record included; never because of a
// damaged record.
//
// Open writes records in DefaultWriteVersion; OpenWith is Open with Options.
func Open(dir, bootID string, log *slog.Logger) (*Store, *LoadReport, error) {
	return OpenWith(dir, bootID, Options{Log: log})
}

// OpenWith is Open with the settings of opt. It fails with errdefs.ErrInvalidArgument, having changed
// nothing, when opt.WriteVersion is not a version this code writes.
func OpenWith(dir, bootID string, opt Options) (*Store, *LoadReport, error) {
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	version := cmp.Or(opt.WriteVersion, DefaultWriteVersion)
	var (
		report LoadReport
		newer  []*crustv1.Volume // loaded, in a version newer than the one written
		mu     sync.Mutex        // the check runs on several goroutines
	)
	check := func(l recordfile.Loaded) (bool, error) {
		v, err := decodeVolume(l.Version, l.Payload)
		if err != nil {
			return false, err
		}
		target := v.GetSpec().GetVolumeTargetPath()
		if want := keyOf(target) + ".json"; l.Name != want {
			return false, fmt.Errorf("file name does not match target path %q (want %s)", target, want)
		}
		mu.Lock()
		defer mu.Unlock()
		if l.BootID != bootID {
			log.Info("store: dropping a record of another boot", "target", target, "bootId", l.BootID)
			report.Dropped = append(report.Dropped, target)
			return true, nil
		}
		report.Volumes = append(report.Volumes, v)
		if l.Version > version {
			newer = append(newer, v)
		}
		return false, nil
	}
	d, r, err := recordfile.Open(dir, recordfile.Options{
		Version: recordVersion, OldestVersion: oldestRecordVersion, WriteVersion: version,
		Field: payloadField, BootID: bootID, Records: "volumes", Extra: []string{revisionDir}, Holder: holder, Log: log,
	}, check)
	if err != nil {
		return nil, nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{dir: d, version: version, bootID: bootID, kept: readRevision(d, bootID, log)}
	for _, v := range newer {
		if err := s.Put(v); err != nil {
			s.Close()
			return nil, nil, fmt.Errorf("store: rewrite a record in version %d: %w", version, err)
		}
	}
	if len(newer) > 0 {
		log.Info("store: rewrote the records of a newer version than the one written, for a rollback",
			"records", len(newer), "version", version)
	}
	report.Corrupt = r.Corrupt
	slices.SortFunc(report.Volumes, func(a, b *crustv1.Volume) int {
		return strings.Compare(a.GetSpec().GetVolumeTargetPath(), b.GetSpec().GetVolumeTargetPath())
	})
	slices.Sort(report.Dropped)
	return s, &report, nil
}

// Put stores v in the store's write version, replacing the record of its target path if there is one.
// The record is durable when Put returns nil. When it returns an error, the stored record is the old one or the new one; calling Put
// again is safe. Put does not keep or modify v. It fails with ErrInvalidArgument for a volume without a
// target path or one whose record would exceed 1 MiB.
func (s *Store) Put(v *crustv1.Volume) error {
	target := v.GetSpec().GetVolumeTargetPath()
	if target == "" {
		return fmt.Errorf("store: volume has no target path: %w", errdefs.ErrInvalidArgument)
	}
	payload, err := encodeVolume(s.version, v)
	if err != nil {
		return fmt.Errorf("store: put %q: %w", target, err)
	}
	if err := s.dir.Put(keyOf(target)+".json", payload); err != nil {
		return fmt.Errorf("store: put %q: %w", target, err)
	}
	return nil
}

// Delete removes the record of target. The removal is durable when Delete returns nil. An unknown target
// is not an error.
func (s *Store) Delete(target string) error {
	if target == "" {
		return fmt.Errorf("store: empty target path: %w", errdefs.ErrInvalidArgument)
	}
	if err := s.dir.Delete(keyOf(target) + ".json"); err != nil {
		return fmt.Errorf("store: delete %q: %w", target, err)
	}
	return nil
}

// Close gives the directory up for another crustd. It is safe to call more than once.
func (s *Store) Close() { s.dir.Close() }
