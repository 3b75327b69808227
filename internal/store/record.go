package store

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	"crust.dev/crust/internal/recordfile"
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// recordVersion is the record format this code writes, and the newest it reads.
const recordVersion = 1

// maxRecordSize bounds a record file. Put refuses a larger record, so anything Put accepts Open loads.
const maxRecordSize = recordfile.MaxSize

// payloadField is the envelope's key for the volume.
const payloadField = "volume"

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

// decodeVolume decodes and checks a record's payload.
func decodeVolume(payload []byte) (*crustv1.Volume, error) {
	v := &crustv1.Volume{}
	if err := unmarshalVolume.Unmarshal(payload, v); err != nil {
		return nil, fmt.Errorf("bad volume: %w", err)
	}
	if v.GetSpec().GetVolumeTargetPath() == "" {
		return nil, errors.New("volume has no target path")
	}
	return v, nil
}
