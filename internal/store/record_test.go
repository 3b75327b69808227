package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/recordfile"
)

// FuzzDecodeRecord checks that the decoder never panics, and that whatever it accepts is a verified
// record: written again, it decodes to the same volume and boot id. It decodes data as it is, and payload
// wrapped in an envelope with the right checksum, so that the fuzzer also reaches the payload decoding
// behind the checksum.
func FuzzDecodeRecord(f *testing.F) {
	good, err := encodeRecord(bootA, fullVol("/k/pods/p/mount"))
	if err != nil {
		f.Fatal(err)
	}
	current, err := encodeVolume(recordVersion, fullVol("/k/x"))
	if err != nil {
		f.Fatal(err)
	}
	payloads := [][]byte{
		current,
		[]byte(`"CgUKAy9reA=="`), // a spec with target path /kx
		[]byte(`"CgUKAy9reA\u003d\u003d"`),
		[]byte(`{"spec":{"volumeTargetPath":"/k/x","futureField":[1,{"a":null}]}}`),
		[]byte(` {"spec" : {"volumeTargetPath":"/k/x", "metadata":{"k":"\u00fc"}}} `),
		[]byte(`{"spec":{"volumeTargetPath":"/k/x","volumeType":"VOLUME_TYPE_PMEM"},"stageTime":"2025-01-02T03:04:05Z"}`),
		[]byte(`{}`),
		[]byte(`null`),
	}
	for i, seed := range [][]byte{
		good,
		good[:len(good)/2],
		bytes.Replace(good, []byte("pvc"), []byte("pvd"), 1),
		bytes.Replace(good, []byte(`"version":2`), []byte(`"version":3`), 1),
		bytes.Replace(good, []byte(`"version":2`), []byte(`"version":1`), 1),
		bytes.Replace(good, []byte(`"version":2`), []byte(`"version":1.5`), 1),
		rawRecord(1, bootA, []byte(` {"spec" : {"volumeTargetPath":"/k/x"}} `)),
		rawRecord(1, "", []byte(`{"spec":{"volumeTargetPath":"/k/x"}}`)),
		[]byte(`{"version":1,"bootId":"b","sha256":"","volume":null}`),
		[]byte(`{"VERSION":1,"version":1}`),
		[]byte(`[]`),
		[]byte(`null`),
		{},
	} {
		f.Add(seed, payloads[i%len(payloads)])
	}
	f.Fuzz(func(t *testing.T, data, payload []byte) {
		checkDecode(t, data)
		for version := oldestRecordVersion; version <= recordVersion; version++ {
			checkDecode(t, rawRecord(version, bootA, payload))
		}
	})
}

func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	rec, err := decodeRecord(data)
	if err != nil {
		if rec.volume != nil {
			t.Fatalf("error %v with a volume", err)
		}
		return
	}
	if rec.bootID == "" || rec.volume.GetSpec().GetVolumeTargetPath() == "" {
		t.Fatalf("accepted a record without boot id or target: %+v", rec)
	}
	again, err := encodeRecord(rec.bootID, rec.volume)
	if err != nil {
		t.Fatalf("an accepted volume cannot be written again: %v", err)
	}
	rec2, err := decodeRecord(again)
	if err != nil {
		t.Fatalf("re-encoded record does not decode: %v\n%s", err, again)
	}
	if rec2.bootID != rec.bootID || !proto.Equal(rec2.volume, rec.volume) {
		t.Fatalf("round trip changed the record:\n%+v\n%+v", rec, rec2)
	}
}

func TestDecodeRecordNewerVersion(t *testing.T) {
	for _, data := range []string{
		`{"version":3}`,
		`{"version":4,"bootId":7}`,
		`{"bootId":"x","version":1000,"volume":{}}`,
	} {
		if _, err := decodeRecord([]byte(data)); !errors.Is(err, errNewerVersion) {
			t.Errorf("decodeRecord(%s): %v, want errNewerVersion", data, err)
		}
	}
}

// errNewerVersion marks a record written by a newer format than this code knows.
var errNewerVersion = recordfile.ErrNewerVersion

// encodeRecord returns the record of v written under bootID.
func encodeRecord(bootID string, v *crustv1.Volume) ([]byte, error) {
	payload, err := encodeVolume(recordVersion, v)
	if err != nil {
		return nil, err
	}
	return recordfile.Encode(recordVersion, bootID, payloadField, payload)
}

// record is a decoded, verified record.
type record struct {
	bootID string
	volume *crustv1.Volume
}

// decodeRecord parses and verifies a record. It returns an error wrapping errNewerVersion for a record of
// a newer format, and another error for anything that is not a valid record of a version read. It does not check
// the file name or the boot id; the caller does.
func decodeRecord(data []byte) (record, error) {
	rec, err := recordfile.Decode(data, oldestRecordVersion, recordVersion, payloadField)
	if err != nil {
		return record{}, err
	}
	v, err := decodeVolume(rec.Version, rec.Payload)
	if err != nil {
		return record{}, err
	}
	return record{bootID: rec.BootID, volume: v}, nil
}

// FuzzBase64String: for any valid JSON, base64String answers as json.Unmarshal into a []byte does.
func FuzzBase64String(f *testing.F) {
	for _, seed := range []string{`"CgUKAy9reA=="`, `""`, `"CgUKAy9reA\u003d\u003d"`, `"\/\/8="`, `"no pe"`, `"QQ"`, `null`, `12`, `"é"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		if !json.Valid(s) {
			return // the record engine hands over valid JSON only
		}
		got, err := base64String(s)
		var want []byte
		werr := json.Unmarshal(s, &want)
		if (err == nil) != (werr == nil) || (err == nil && !bytes.Equal(got, want)) {
			t.Fatalf("base64String(%s) = %q, %v; json.Unmarshal gives %q, %v", s, got, err, want, werr)
		}
	})
}
