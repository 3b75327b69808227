package store

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// recordVersion is the record format this code writes, and the newest it reads.
const recordVersion = 1

// maxRecordSize bounds a record file. Put refuses a larger record, so anything Put accepts Open loads.
const maxRecordSize = 1 << 20

// errNewerVersion marks a record written by a newer format than this code knows.
var errNewerVersion = errors.New("written by a newer crustd")

// envelope is a version 1 record as read back. Volume is a json.RawMessage so that the bytes the checksum
// is verified over are exactly the bytes in the file.
type envelope struct {
	Version int             `json:"version"`
	BootID  string          `json:"bootId"`
	SHA256  string          `json:"sha256"`
	Volume  json.RawMessage `json:"volume"`
}

// unmarshalVolume decodes a payload. Unknown fields (and unknown enum names) are discarded: a newer crustd
// may add fields to Volume without a new record version, as protobuf's compatibility rules allow, and an
// older crustd must then still load the descriptor rather than move it aside as corrupt and lose the
// volume. What it drops is what it could not act on anyway. Changes an older crustd must not ignore take a
// new record version, which it refuses.
var unmarshalVolume = protojson.UnmarshalOptions{DiscardUnknown: true}

// keyOf returns the file name key of a target path: the lowercase hex SHA-256 of its bytes.
func keyOf(target string) string {
	sum := sha256.Sum256([]byte(target))
	return hex.EncodeToString(sum[:])
}

// encodeRecord returns the record of v written under bootID.
//
// The envelope is assembled by hand rather than with json.Marshal, because json.Marshal compacts a
// json.RawMessage, and protojson output may contain spaces: the checksum must be over the bytes as stored.
func encodeRecord(bootID string, v *crustv1.Volume) ([]byte, error) {
	payload, err := protojson.Marshal(v)
	if err != nil {
		return nil, err
	}
	id, err := json.Marshal(bootID)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(payload)
	b := make([]byte, 0, len(payload)+len(id)+128)
	b = fmt.Appendf(b, `{"version":%d,"bootId":`, recordVersion)
	b = append(b, id...)
	b = append(b, `,"sha256":"`...)
	b = hex.AppendEncode(b, sum[:])
	b = append(b, `","volume":`...)
	b = append(b, payload...)
	b = append(b, "}\n"...)
	return b, nil
}

// record is a decoded, verified record.
type record struct {
	bootID string
	volume *crustv1.Volume
}

// decodeRecord parses and verifies a record. It returns an error wrapping errNewerVersion for a record of
// a newer format, and another error for anything that is not a valid version 1 record. It does not check
// the file name or the boot id; the caller does.
func decodeRecord(data []byte) (record, error) {
	if len(data) > maxRecordSize {
		return record{}, fmt.Errorf("record is %d bytes, more than %d", len(data), maxRecordSize)
	}
	// The version first, alone, so that a newer format is recognised even if the rest of its envelope
	// would not parse as version 1.
	var head struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return record{}, fmt.Errorf("not a JSON record: %w", err)
	}
	switch {
	case head.Version > recordVersion:
		return record{}, fmt.Errorf("record version %d, newer than %d which this code reads: %w", head.Version, recordVersion, errNewerVersion)
	case head.Version < recordVersion:
		return record{}, fmt.Errorf("missing or invalid version %d", head.Version)
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return record{}, fmt.Errorf("bad envelope: %w", err)
	}
	if env.BootID == "" {
		return record{}, errors.New("empty bootId")
	}
	if len(env.Volume) == 0 {
		return record{}, errors.New("no volume")
	}
	sum := sha256.Sum256(env.Volume)
	if got := hex.EncodeToString(sum[:]); env.SHA256 != got {
		return record{}, fmt.Errorf("checksum mismatch: recorded %q, payload has %q", env.SHA256, got)
	}
	v := &crustv1.Volume{}
	if err := unmarshalVolume.Unmarshal(env.Volume, v); err != nil {
		return record{}, fmt.Errorf("bad volume: %w", err)
	}
	if v.GetSpec().GetVolumeTargetPath() == "" {
		return record{}, errors.New("volume has no target path")
	}
	return record{bootID: env.BootID, volume: v}, nil
}
