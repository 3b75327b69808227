// Package recordfile is crust's one crash-safe record engine, shared by crustd's store of descriptors
// (internal/store) and the CSI proxy's journal (internal/csiproxy): small records, one JSON document per
// file, in a directory that one process at a time owns. This documentation is the engine's contract, the
// one place it is written: its users document only what they add (their records subdirectory, the names
// of their record files, their payload, and what a record of another boot means to them), and
// docs/security.md ("State on disk") links here.
//
// # Promises
//
//   - Dir.Put and Dir.Delete are durable when they return nil, and a crash at any instant leaves each
//     record wholly old or wholly new, never torn: a record is written to a temporary file in tmp/ (same
//     filesystem), fsynced, renamed over its name, and the directory is fsynced. Delete unlinks the
//     record and fsyncs the directory.
//   - One process at a time: Open takes <dir>/lock for its Options.Holder before it creates, empties or
//     moves anything in dir, and Dir.Close gives it up. A second opener, in this process or another, fails at
//     once, having changed nothing, with an error wrapping ErrHeld and errdefs.ErrFailedPrecondition that
//     names the directory and the holder (`/run/crust is held by pid 42 (crustd)`). The lock is an
//     exclusive flock(2) (api/safedir's Dir.Lock), the kernel's: it goes with the holder's process however
//     that ends, so a crash never leaves a stale lock.
//   - Every file operation is relative to a directory opened once (api/safedir) and never follows a
//     symbolic link. The directory must be ours and writable by us alone: Open refuses, naming the path,
//     with errdefs.ErrFailedPrecondition, a link at the place of dir, of <dir>/lock or of a subdirectory,
//     and a dir another user owns or its group or others may write in.
//   - Open never fails because of a damaged record: it moves the file into corrupt/ (the quarantine),
//     logs and reports it.
//   - Open fails, before it deletes or moves anything, on a record of a newer format version, so that an
//     older program over a newer one's state loses nothing; and on an I/O error reading a record, because
//     the record may well be good (moving it aside would lose what it holds) and a restart retries.
//   - A record carries the boot id of its writer. What a record of another boot means is the user's to
//     say, through its Check: crustd drops its descriptors (a VM does not survive a reboot), the proxy
//     keeps its journal (an obligation to undo survives a reboot).
//
// # On-disk format
//
// This format is a contract: a change that older code cannot read correctly takes a new record version.
//
//	<dir>/                          ours, writable by us alone; created mode 0700 if missing (an existing
//	                                one keeps its mode)
//	<dir>/lock                      mode 0600: "pid <pid> (<holder>)" of the last holder; its flock(2) is
//	                                the lock
//	<dir>/<records>/<name>          one record, mode 0600 (the user names its records subdirectory and files)
//	<dir>/tmp/                      files of writes in progress; emptied by Open
//	<dir>/corrupt/<name>.<UTC time> a file Open moved aside, such as x.json.20250102T030405.123456789Z
//	<dir>/<extra>/                  a subdirectory the user keeps beside its records (Options.Extra);
//	                                Open leaves its files alone, and Dir.WriteExtra writes them as Put
//	                                writes a record (the user says what they hold and what a damaged
//	                                one means)
//
// Every subdirectory has mode 0700 (Open tightens a looser one). A record is one JSON object, written as
// one line ending in a newline:
//
//	{"version":V,"bootId":"<boot id>","sha256":"<hex sha256 of the payload bytes>","<field>":<payload>}
//
// version is a JSON integer (every future format keeps it, so that older code recognises a record it must
// not touch); bootId the writer's boot id (ReadBootID: /proc/sys/kernel/random/boot_id), non-empty;
// sha256 the lowercase hex SHA-256 of the payload bytes exactly as stored, from the first byte of the
// value of <field> to its last (a JSON string's quotes included); <field> the user's payload, any JSON.
// Writers write the members in the order shown, without whitespace; readers accept whitespace and any
// member order. The checksum is over the payload's bytes as stored, which is why the envelope is
// assembled here rather than by json.Marshal (that would re-compact the payload), and it covers only the
// payload: a damaged bootId makes a record look like another boot's, and a damaged version can make Open
// refuse to start. A record file is at most MaxSize bytes (1 MiB); Put refuses a larger record, so that
// everything Put accepts Open loads.
//
// Open empties tmp/, then classifies every entry of the records subdirectory before acting on any:
//
//  1. Of a version newer than the user's: Open fails naming the file, having changed nothing.
//  2. Not a regular file, larger than MaxSize, not JSON, a version older than the oldest the user reads
//     (Options.OldestVersion) or missing, an empty bootId, no payload, a checksum mismatch, or refused by
//     the user's Check (a payload that does not decode, a file name that does not match it): moved into
//     corrupt/, logged at Warn, reported.
//  3. Dropped by the user's Check: deleted, reported.
//  4. Otherwise kept: the Check holds what it needs of it. A user that changes its payload's encoding
//     takes a new version and keeps reading the old ones, telling them apart by Loaded.Version; it keeps
//     writing the old one (Options.WriteVersion) until the previous release of its program reads the new
//     one, so that a rollback loses nothing.
package recordfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"crust.dev/crust/api/safedir"
)

// MaxSize bounds a record file; Read refuses to load more.
const MaxSize = 1 << 20

// ErrNewerVersion marks a record written in a newer format than the reader knows. A reader must not treat
// it as damage: a downgrade must not lose state.
var ErrNewerVersion = errors.New("written by a newer version")

// Encode returns the file content of payload (a JSON value) under field, with version and bootID.
func Encode(version int, bootID, field string, payload []byte) ([]byte, error) {
	id, err := json.Marshal(bootID)
	if err != nil {
		return nil, err
	}
	name, err := json.Marshal(field)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(payload)
	b := make([]byte, 0, len(payload)+len(id)+len(name)+96)
	b = fmt.Appendf(b, `{"version":%d,"bootId":`, version)
	b = append(b, id...)
	b = append(b, `,"sha256":"`...)
	b = hex.AppendEncode(b, sum[:])
	b = append(b, `",`...)
	b = append(b, name...)
	b = append(b, ':')
	b = append(b, payload...)
	b = append(b, "}\n"...)
	return b, nil
}

// Record is what a valid record holds.
type Record struct {
	Version int    // its format version
	BootID  string // the boot id it was written under
	Payload []byte // the payload, byte for byte as stored
}

// Decode verifies data as a record of a version from oldest to newest under field. A newer version is an
// error wrapping ErrNewerVersion; anything else that is not a valid record (bad JSON, a version older
// than oldest or missing, an empty boot id, no payload, a checksum mismatch) is another error saying what
// is wrong.
func Decode(data []byte, oldest, newest int, field string) (Record, error) {
	if len(data) > MaxSize {
		return Record{}, fmt.Errorf("record is %d bytes, more than %d", len(data), MaxSize)
	}
	for version := newest; version >= oldest; version-- {
		// The layout Encode writes, read without a JSON parse of the envelope (a start reads thousands);
		// the payload must still be one JSON value, as the general path would have found.
		bootID, payload, sum, ok := cutWritten(data, version, field)
		if !ok {
			continue
		}
		got := sha256.Sum256(payload)
		if hex.EncodeToString(got[:]) == sum && validJSON(payload) {
			return Record{Version: version, BootID: bootID, Payload: payload}, nil
		}
		break
	}
	return decodeJSON(data, oldest, newest, field)
}

// validJSON is json.Valid, with a quicker answer for a string of printable ASCII without escapes (such
// as base64), which a byte loop checks at a fraction of the cost of json.Valid's state machine.
func validJSON(p []byte) bool {
	if len(p) < 2 || p[0] != '"' || p[len(p)-1] != '"' {
		return json.Valid(p)
	}
	for _, c := range p[1 : len(p)-1] {
		if c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			return json.Valid(p)
		}
	}
	return true
}

// decodeJSON is Decode for a record in any layout JSON allows.
func decodeJSON(data []byte, oldest, newest int, field string) (Record, error) {
	// The version first, alone, so that a newer format is recognised even if the rest of its envelope
	// would not parse as this one.
	var head struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return Record{}, fmt.Errorf("not a JSON record: %w", err)
	}
	switch {
	case head.Version > newest:
		return Record{}, fmt.Errorf("record version %d, newer than %d which this code reads: %w", head.Version, newest, ErrNewerVersion)
	case head.Version < oldest:
		return Record{}, fmt.Errorf("missing or invalid version %d", head.Version)
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(data, &env); err != nil {
		return Record{}, fmt.Errorf("bad envelope: %w", err)
	}
	r := Record{Version: head.Version}
	var sumHex string
	if err := json.Unmarshal(env["bootId"], &r.BootID); err != nil || r.BootID == "" {
		return Record{}, errors.New("empty bootId")
	}
	if err := json.Unmarshal(env["sha256"], &sumHex); err != nil {
		return Record{}, errors.New("no sha256")
	}
	if r.Payload = env[field]; len(r.Payload) == 0 {
		return Record{}, fmt.Errorf("no %s", field)
	}
	sum := sha256.Sum256(r.Payload)
	if got := hex.EncodeToString(sum[:]); sumHex != got {
		return Record{}, fmt.Errorf("checksum mismatch: recorded %q, payload has %q", sumHex, got)
	}
	return r, nil
}

// cutWritten splits data laid out exactly as Encode writes it for version and field into its boot id,
// payload and recorded checksum; ok is false for anything else (other member order, white space,
// escapes in the boot id), which Decode then reads as JSON.
func cutWritten(data []byte, version int, field string) (bootID string, payload []byte, sum string, ok bool) {
	rest, ok := bytes.CutPrefix(data, fmt.Appendf(nil, `{"version":%d,"bootId":"`, version))
	if !ok {
		return "", nil, "", false
	}
	id, rest, ok := bytes.Cut(rest, []byte(`","sha256":"`))
	if !ok || len(id) == 0 || bytes.ContainsAny(id, "\\\"") || len(rest) < sha256.Size*2 {
		return "", nil, "", false
	}
	sumHex, rest := rest[:sha256.Size*2], rest[sha256.Size*2:]
	name, err := json.Marshal(field)
	if err != nil {
		return "", nil, "", false
	}
	if rest, ok = bytes.CutPrefix(rest, append(append([]byte(`",`), name...), ':')); !ok {
		return "", nil, "", false
	}
	if payload, ok = bytes.CutSuffix(rest, []byte("}\n")); !ok || len(payload) == 0 {
		return "", nil, "", false
	}
	return string(id), payload, string(sumHex), true
}

// Write puts data at name in dir atomically and durably, preparing it in tmp (same filesystem), never
// through a symbolic link (see safedir.Dir.WriteFile). The file has mode 0600.
func Write(dir, tmp *safedir.Dir, name string, data []byte) error {
	return dir.WriteFile(name, data, 0o600, tmp)
}

// Read returns the content of the record file name in dir. A file larger than MaxSize is an error
// wrapping safedir.ErrTooLarge, and is never loaded whole; a symbolic link or anything but a regular file
// at name is an error wrapping safedir.ErrWrongType, and is not read through.
func Read(dir *safedir.Dir, name string) ([]byte, error) {
	return dir.ReadFile(name, MaxSize)
}

// bootIDPath is where the kernel publishes the id of the running boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// ReadBootID returns the id of the running boot, from /proc/sys/kernel/random/boot_id, without the
// trailing newline. It changes on every boot and never within one.
func ReadBootID() (string, error) {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read boot id: %s is empty", bootIDPath)
	}
	return id, nil
}
