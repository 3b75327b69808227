// Package store is crustd's crash-safe persistence of volume descriptors (*crustv1.Volume), one record
// per target path (Volume.Spec.VolumeTargetPath). It knows nothing of gRPC or Kata, and it keeps no index:
// the caller holds the descriptors in memory, calls Put and Delete to make changes durable, and calls Open
// once at start to read back what survived.
//
// # Promises
//
//   - Put and Delete are durable when they return nil: the change survives a crash of the process or of
//     the machine (given a filesystem that honours fsync).
//   - A crash at any instant leaves each record wholly old or wholly new, never torn; Open never sees a
//     half-written record.
//   - Put and Delete are idempotent. They are safe to call concurrently for different target paths; calls
//     for one target path must be serialised by the caller.
//   - Open never fails because of a damaged record: it moves the file aside, logs it and reports it.
//   - Open deletes the records written under another boot id and reports their target paths.
//   - Open fails, before it deletes or moves any record, when it finds a record of a newer format version,
//     so that running an older crustd over a newer one's state loses nothing.
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
//   - version: the record format version, a JSON integer. This code writes 1 and reads 1. Every future
//     format keeps a top-level integer "version" member, so that older code recognises a record it must not
//     touch.
//   - bootId: the boot id (see recordfile.ReadBootID) of the boot that wrote the record; a non-empty string.
//   - sha256: the lowercase hex SHA-256 of the payload bytes exactly as they are in the file, from the first
//     byte of the value of "volume" to its last.
//   - volume: the payload, the proto3 JSON encoding (protojson) of crust.v1.Volume. protojson output is not
//     byte-stable across builds, so the checksum is taken over the stored bytes and verified against them,
//     never against a re-encoding.
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
//  1. A record whose version is greater than 1: Open fails naming the file, before it deletes or moves any
//     record.
//  2. Not a valid version 1 record: not a regular file, larger than 1 MiB, not JSON, version missing or
//     below 1, empty bootId, no volume, checksum mismatch, a payload that is not a Volume, an empty target
//     path, or a file name that is not <key of its target path>.json. The file is moved into
//     <dir>/corrupt, logged at Warn and reported in LoadReport.Corrupt.
//  3. A valid record with another bootId: deleted, its target path reported in LoadReport.Dropped.
//  4. Otherwise the record is loaded into LoadReport.Volumes.
//
// Unknown fields and enum names in the payload are ignored: a newer crustd may add fields to Volume within
// record version 1, and an older crustd must still load the descriptor rather than lose the volume.
package store

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"time"

	"crust.dev/crust/internal/recordfile"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
	"crust.dev/crust/pkg/errdefs"
	"crust.dev/crust/pkg/safedir"
)

// corruptTimeFormat is the suffix of a file moved into corrupt/.
const corruptTimeFormat = "20060102T150405.000000000Z"

// Store persists descriptors under one directory. Create it with Open.
type Store struct {
	bootID  string
	volumes *safedir.Dir // <dir>/volumes
	tmp     *safedir.Dir // <dir>/tmp
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
// errors; it does not fail because of a damaged record.
func Open(dir, bootID string, log *slog.Logger) (*Store, *LoadReport, error) {
	if bootID == "" {
		return nil, nil, fmt.Errorf("store: empty boot id: %w", errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.Default()
	}
	root, err := safedir.OpenOwned(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("store: %w", precondition(err))
	}
	defer func() { _ = root.Close() }() // the subdirectories stay open
	var subs [3]*safedir.Dir
	for i, name := range []string{"volumes", "tmp", "corrupt"} {
		if subs[i], err = root.EnsureDir(name, 0o700); err != nil {
			return nil, nil, fmt.Errorf("store: %w", precondition(err))
		}
	}
	volumes, tmp, corrupt := subs[0], subs[1], subs[2]
	defer func() { _ = corrupt.Close() }()
	s := &Store{bootID: bootID, volumes: volumes, tmp: tmp}
	// Make the subdirectories' entries durable before any record is written into them.
	if err := root.Sync(); err != nil {
		return nil, nil, fmt.Errorf("store: %w", err)
	}

	if err := removeContents(tmp, log); err != nil {
		return nil, nil, fmt.Errorf("store: clean %s: %w", tmp.Path(), err)
	}

	// Classify every record before deleting or moving any, so that a record of a newer version fails Open
	// with all records where they were.
	entries, err := volumes.Names()
	if err != nil {
		return nil, nil, fmt.Errorf("store: %w", err)
	}
	type damaged struct{ name, reason string }
	var (
		report  LoadReport
		bad     []damaged
		dropped []string // file names
	)
	for _, name := range entries {
		rec, err := readRecord(volumes, name)
		switch {
		case errors.Is(err, errNewerVersion):
			return nil, nil, fmt.Errorf("store: %s: %w; refusing to load anything so that a downgrade loses nothing: %w",
				volumes.Join(name), err, errdefs.ErrFailedPrecondition)
		case errors.Is(err, errIO):
			return nil, nil, fmt.Errorf("store: %w", err)
		case err != nil:
			bad = append(bad, damaged{name, err.Error()})
			continue
		}
		target := rec.volume.GetSpec().GetVolumeTargetPath()
		if want := keyOf(target) + ".json"; name != want {
			bad = append(bad, damaged{name, fmt.Sprintf("file name does not match target path %q (want %s)", target, want)})
			continue
		}
		if rec.bootID != bootID {
			log.Info("store: dropping a record of another boot", "target", target, "bootId", rec.bootID)
			dropped = append(dropped, name)
			report.Dropped = append(report.Dropped, target)
			continue
		}
		report.Volumes = append(report.Volumes, rec.volume)
	}

	for _, name := range dropped {
		if err := volumes.Remove(name); err != nil {
			return nil, nil, fmt.Errorf("store: drop record of another boot: %w", err)
		}
	}
	now := time.Now().UTC().Format(corruptTimeFormat)
	for _, b := range bad {
		to := b.name + "." + now
		log.Warn("store: moving a corrupt record aside", "file", volumes.Join(b.name), "to", corrupt.Join(to), "reason", b.reason)
		if err := volumes.Rename(b.name, corrupt, to); err != nil {
			return nil, nil, fmt.Errorf("store: move corrupt record aside: %w", err)
		}
		report.Corrupt = append(report.Corrupt, corrupt.Join(to))
	}
	if len(bad) > 0 {
		if err := corrupt.Sync(); err != nil {
			return nil, nil, fmt.Errorf("store: %w", err)
		}
	}
	if len(bad) > 0 || len(dropped) > 0 {
		if err := volumes.Sync(); err != nil {
			return nil, nil, fmt.Errorf("store: %w", err)
		}
	}

	slices.SortFunc(report.Volumes, func(a, b *crustv1.Volume) int {
		return strings.Compare(a.GetSpec().GetVolumeTargetPath(), b.GetSpec().GetVolumeTargetPath())
	})
	slices.Sort(report.Dropped)
	slices.Sort(report.Corrupt)
	return s, &report, nil
}

// precondition marks a state directory that is not what crustd may work in (a link, another owner, a
// loose mode) as a failed precondition: the operator must fix it.
func precondition(err error) error {
	if errors.Is(err, safedir.ErrWrongType) || errors.Is(err, safedir.ErrInsecure) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	return err
}

// Put stores v, replacing the record of its target path if there is one. The record is durable when Put
// returns nil. When it returns an error, the stored record is the old one or the new one; calling Put
// again is safe. Put does not keep or modify v. It fails with ErrInvalidArgument for a volume without a
// target path or one whose record would exceed 1 MiB.
func (s *Store) Put(v *crustv1.Volume) error {
	target := v.GetSpec().GetVolumeTargetPath()
	if target == "" {
		return fmt.Errorf("store: volume has no target path: %w", errdefs.ErrInvalidArgument)
	}
	b, err := encodeRecord(s.bootID, v)
	if err != nil {
		return fmt.Errorf("store: put %q: %w", target, err)
	}
	if len(b) > maxRecordSize {
		return fmt.Errorf("store: put %q: record is %d bytes, more than %d: %w", target, len(b), maxRecordSize, errdefs.ErrInvalidArgument)
	}
	if err := s.write(keyOf(target)+".json", b); err != nil {
		return fmt.Errorf("store: put %q: %w", target, err)
	}
	return nil
}

func (s *Store) write(name string, b []byte) error {
	return recordfile.Write(s.volumes, s.tmp, name, b)
}

// Delete removes the record of target. The removal is durable when Delete returns nil. An unknown target
// is not an error.
func (s *Store) Delete(target string) error {
	if target == "" {
		return fmt.Errorf("store: empty target path: %w", errdefs.ErrInvalidArgument)
	}
	err := s.volumes.Remove(keyOf(target) + ".json")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: delete %q: %w", target, err)
	}
	// Sync even when the file was already gone: an earlier Delete may have unlinked it and then failed to
	// sync, and this call must not report success for a removal that is not yet durable.
	if err := s.volumes.Sync(); err != nil {
		return fmt.Errorf("store: delete %q: %w", target, err)
	}
	return nil
}

// errIO marks a failure to read a record file, as opposed to a damaged record.
var errIO = errors.New("I/O error")

// readRecord reads and decodes the record file name of dir. Anything but a regular file (a link
// included, never read through) is a damaged record, not an I/O error.
func readRecord(dir *safedir.Dir, name string) (record, error) {
	data, err := recordfile.Read(dir, name)
	if errors.Is(err, safedir.ErrWrongType) {
		return record{}, err
	}
	if err != nil {
		return record{}, fmt.Errorf("%w: %w", errIO, err)
	}
	return decodeRecord(data)
}

// removeContents removes everything inside dir, leaving dir itself, never following a link.
func removeContents(dir *safedir.Dir, log *slog.Logger) error {
	names, err := dir.Names()
	if err != nil {
		return err
	}
	for _, name := range names {
		log.Debug("store: removing a leftover temporary file", "file", dir.Join(name))
		if err := dir.RemoveAll(name); err != nil {
			return err
		}
	}
	return nil
}
