package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// Record format versions: this code reads every version from oldestRecordVersion to recordVersion, and
// writes the one Options.WriteVersion names.
const (
	recordVersion       = 2 // payload: the base64 of the protobuf encoding of the volume
	oldestRecordVersion = 1 // payload: the protojson encoding of the volume
)

// The record format versions a store reads, and may be told to write (Options.WriteVersion).
const (
	OldestVersion = oldestRecordVersion
	NewestVersion = recordVersion
)

// DefaultWriteVersion is the record format version Put writes unless Options say otherwise: the newest
// version the previous release of crust reads, so that rolling crustd back to it loses no descriptor. The
// previous release, v0.1.0, reads version 1 alone; the default moves to 2 in v0.3.0, the first release
// whose previous one (v0.2.0) reads version 2, as the package documentation says.
const DefaultWriteVersion = 1

// payloadField is the envelope's key for the volume.
const payloadField = "volume"

// Unknown fields are discarded: a newer crustd may add fields to Volume without a new record version, as
// protobuf's compatibility rules allow, and an older crustd must then still load the descriptor rather
// than move it aside as corrupt and lose the volume. What it drops is what it could not act on anyway.
// An enum value it does not know is dropped in version 1 (protojson names it) and kept as its number in
// version 2, as protobuf keeps unknown enum numbers. Changes an older crustd must not ignore take a new
// record version, which it refuses.
var (
	unmarshalVolume   = proto.UnmarshalOptions{DiscardUnknown: true}
	unmarshalVolumeV1 = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// keyOf returns the file name key of a target path: the lowercase hex SHA-256 of its bytes.
func keyOf(target string) string {
	sum := sha256.Sum256([]byte(target))
	return hex.EncodeToString(sum[:])
}

// encodeVolume returns the payload of v in the given record version: in version 2 a JSON string holding
// the standard base64 of v's protobuf encoding, in version 1 v's protojson encoding.
func encodeVolume(version int, v *crustv1.Volume) ([]byte, error) {
	switch version {
	case oldestRecordVersion:
		return protojson.Marshal(v)
	case recordVersion:
		bin, err := proto.Marshal(v)
		if err != nil {
			return nil, err
		}
		return json.Marshal(bin) // a []byte is written as its base64
	}
	return nil, fmt.Errorf("record version %d is not written here", version)
}

// base64String returns the bytes that the JSON string s holds in standard base64, as json.Unmarshal into
// a []byte would: without a JSON parse when s has no escapes, as encodeVolume writes it (the record engine
// has checked that s is valid JSON).
func base64String(s []byte) ([]byte, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' || bytes.IndexByte(s, '\\') >= 0 {
		var b []byte
		err := json.Unmarshal(s, &b)
		return b, err
	}
	enc := s[1 : len(s)-1]
	b := make([]byte, base64.StdEncoding.DecodedLen(len(enc)))
	n, err := base64.StdEncoding.Decode(b, enc)
	return b[:n], err
}

// decodeVolume decodes and checks the payload of a record of the given version.
func decodeVolume(version int, payload []byte) (*crustv1.Volume, error) {
	v := &crustv1.Volume{}
	var err error
	switch version {
	case oldestRecordVersion:
		err = unmarshalVolumeV1.Unmarshal(payload, v)
	case recordVersion:
		var bin []byte
		if bin, err = base64String(payload); err == nil {
			err = unmarshalVolume.Unmarshal(bin, v)
		}
	default:
		err = fmt.Errorf("record version %d is not read here", version)
	}
	if err != nil {
		return nil, fmt.Errorf("bad volume: %w", err)
	}
	if v.GetSpec().GetVolumeTargetPath() == "" {
		return nil, errors.New("volume has no target path")
	}
	return v, nil
}
