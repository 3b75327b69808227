// Package store is crustd's crash-safe persistence of volume descriptors (*crustv1.Volume), one record
// per target path (Volume.Spec.VolumeTargetPath). It knows nothing of gRPC or Kata, and it keeps no index:
// the caller holds the descriptors in memory, calls Put and Delete to make changes durable, and calls Open
// once at start to read back what survived. The records are kept by the record engine
// (internal/recordfile); this package adds what they hold and which to keep.
//
// # Promises
//
//   - Put and Delete are durable when they return nil: the change survives a crash of the process or of
//     the machine (given a filesystem that honours fsync).
//   - A crash at any instant leaves each record wholly old or wholly new, never torn; Open never sees a
//     half-written record.
//   - Put and Delete are idempotent. They are safe to call concurrently for different target paths; calls
//     for one target path must be serialised by the caller.
//   - Open never fails because of a damaged record: it moves the file aside, logs it and reports it. It
//     does fail on an I/O error reading a record: the record may be good, and a restart retries.
//   - Open deletes the records written under another boot id and reports their target paths.
//   - Open fails, before it deletes or moves any record, when it finds a record of a newer format version,
//     so that running an older crustd over a newer one's state loses nothing.
//   - Put writes the record format version it is told to (Options.WriteVersion), by default the newest one
//     the previous release reads, and Open rewrites in that version the records of this boot written in a
//     newer one: the previous release starts on what this one leaves (a rollback), whatever this one was
//     told before.
//   - No file operation follows a symbolic link: Open refuses a link at the place of dir or of one of its
//     subdirectories, and a link among the records is moved aside as damaged, never read through.
//
// Only one process may use a store directory at a time; the store does not lock it, crustd does
// (internal/dirlock: <dir>/lock, which Open leaves alone).
//
// # On-disk format
//
// This format is a contract: a change that older code cannot read correctly takes a new record version.
//
//	<dir>/                                    ours, writable by us alone; created mode 0700 if missing
//	<dir>/volumes/                            mode 0700
//	<dir>/volumes/<key>.json                  one record per target path, mode 0600
//	<dir>/tmp/                                mode 0700; files of writes in progress; emptied by Open
//	<dir>/corrupt/                            mode 0700
//	<dir>/corrupt/<name>.<UTC time>           a file Open moved aside from volumes/, such as
//	                                          <key>.json.20250102T030405.123456789Z
//
// <key> is the lowercase hex SHA-256 of the target path's bytes (a hash, because a target path may be
// longer than NAME_MAX).
//
// A record is one JSON object, written as one line ending in a newline:
//
//	{"version":1,"bootId":"<boot id>","sha256":"<hex SHA-256 of the payload>","volume":<payload>}
//
// Its members:
//
//   - version: the record format version, a JSON integer. This code reads 1 and 2, and writes the one it
//     is told to (crustd's --store-write-version), 1 by default (see below). Every future format keeps a
//     top-level integer "version" member, so that older code recognises a record it must not touch.
//   - bootId: the boot id (see recordfile.ReadBootID) of the boot that wrote the record; a non-empty string.
//   - sha256: the lowercase hex SHA-256 of the payload bytes exactly as they are in the file, from the first
//     byte of the value of "volume" to its last (in version 2 its quotes included).
//   - volume: the payload. In version 2, a JSON string holding the standard base64 (RFC 4648, padded) of
//     the protobuf binary encoding of crust.v1.Volume: a start decodes thousands, and the binary decodes
//     several times faster than JSON. In version 1, the proto3 JSON encoding (protojson) of
//     crust.v1.Volume. Neither encoding is byte-stable across builds, so the checksum is
//     taken over the stored bytes and verified against them, never against a re-encoding.
//
// Which version is written. crustd before record version 2 (the v0.1.0 images) reads version 1 alone and
// refuses to start on a record of version 2. So the version written is a setting, as the storage version
// of a Kubernetes API server is: by default (DefaultWriteVersion) the newest version the previous release
// reads, 1 until v0.3.0, whose previous release (v0.2.0) reads 2; then the default moves to 2, and
// --store-write-version=1 keeps what a rollback to v0.1.0 needs. A record is read in whatever version it
// is, and written in the write version at its next Put; Open rewrites at once the records of this boot
// in a version newer than the write version, so that after a restart with --store-write-version=1 the
// previous release can be rolled back to. Records of an earlier boot are dropped anyway.
// `crustctl get -o json` and `crustctl ls -o json` show the descriptors crustd holds as JSON.
//
// Writers write the members in the order shown, without whitespace. Readers accept JSON whitespace and
// any member order. The checksum covers only the payload: a damaged bootId makes the record look like
// another boot's (it is dropped and reported), and a damaged version can make Open refuse to start.
//
// Put writes the record to a new file in <dir>/tmp (on the same filesystem), fsyncs it, renames it over
// <dir>/volumes/<key>.json and fsyncs <dir>/volumes. Delete unlinks the record and fsyncs <dir>/volumes.
//
// Open first removes everything in <dir>/tmp, then classifies each entry of <dir>/volumes:
//
//  1. A record whose version is greater than 2: Open fails naming the file, before it deletes or moves any
//     record.
//  2. Not a valid record of version 1 or 2: not a regular file, larger than 1 MiB, not JSON, version
//     missing or below 1, empty bootId, no volume, checksum mismatch, a payload that is not a Volume in its
//     version's encoding, an empty target path, or a file name that is not <key of its target path>.json.
//     The file is moved into <dir>/corrupt, logged at Warn and reported in LoadReport.Corrupt.
//  3. A valid record with another bootId: deleted, its target path reported in LoadReport.Dropped.
//  4. Otherwise the record is loaded into LoadReport.Volumes; one in a version newer than the write
//     version is written again in the write version (logged at Info with their number).
//
// Unknown fields in the payload are ignored (an unknown enum value is dropped in version 1 and kept as its
// number in version 2): a newer crustd may add fields to Volume within a record version, and an older
// crustd must still load the descriptor rather than lose the volume.
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

// Store persists descriptors under one directory. Create it with Open.
type Store struct {
	dir     *recordfile.Dir
	version int // the record format version Put writes
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

// Open creates the store's directories in dir as needed, cleans up after a crash and loads the records,
// as the package documentation describes. bootID is the current boot's id (see recordfile.ReadBootID); records are
// written with it, and records with another one are dropped. A nil log means slog.Default().
//
// dir and its subdirectories are opened once, without following a symbolic link, and every file
// operation of the Store is done relative to them, never through a link. Open fails with
// errdefs.ErrFailedPrecondition, naming the path, when dir or one of its subdirectories is a symbolic link
// or not a directory, or when dir is owned by another user than this process's effective one or writable
// by its group or others (the error names the owner and the mode); it then changes nothing. A missing
// dir is created mode 0700; an existing one keeps its mode.
//
// Open fails on a record of a newer format version (before it deletes or moves any record) and on I/O
// errors, reading or rewriting a record included; it does not fail because of a damaged record.
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
		Field: payloadField, BootID: bootID, Records: "volumes", Log: log,
	}, check)
	if err != nil {
		return nil, nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{dir: d, version: version}
	for _, v := range newer {
		if err := s.Put(v); err != nil {
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
