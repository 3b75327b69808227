// Package katatest gives tests two things to check crust against Kata Containers:
//
//   - the Kata direct-volume vectors (Load): volume paths, mount infos, and the exact files and read-back
//     values that Kata's own code produced for them, to check that code which writes or reads Kata's files
//     does so exactly as Kata does;
//   - Shim, a stand-in for a Kata shim's management server on a unix socket, serving direct-volume stats
//     and resize as Kata's shim does, to check code that talks to it.
//
// It depends on nothing else of crust, so crust.dev/crust/api/kata's own tests can use it.
package katatest

import (
	_ "embed"
	"encoding/json"
	"testing"
)

// VectorsFile is the vectors file committed with this package (a copy of shared/compat's), relative to
// the repository's root.
const VectorsFile = "api/kata/katatest/testdata/kata-direct-volume-vectors.json"

// VectorsJSON is VectorsFile's content, built into the test binary.
//
//go:embed testdata/kata-direct-volume-vectors.json
var VectorsJSON []byte

// Vector is one case. MountInfo and ReadBack are kept as JSON so that callers decode them with the type
// under test (Input, ReadBack).
type Vector struct {
	VolumePath string          `json:"volume_path"`
	MountInfo  json.RawMessage `json:"mount_info"`
	// RawInput, when set, is the exact --mount-info string Kata was given (instead of MountInfo encoded).
	RawInput  *string `json:"raw_input"`
	SandboxID string  `json:"sandbox_id"`
	// Dir is the volume directory's name; Files the files in it, by name, with their exact content.
	Dir   string            `json:"dir"`
	Files map[string]string `json:"files"`
	// ReadBack is the mount info Kata reads back; SandboxRead the sandbox id it finds.
	ReadBack    json.RawMessage `json:"read_back"`
	SandboxRead string          `json:"sandbox_read"`
}

// Load reads every vector, failing t when there are none.
func Load(t testing.TB) []Vector {
	t.Helper()
	var doc struct{ Entries []Vector }
	if err := json.Unmarshal(VectorsJSON, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Entries) == 0 {
		t.Fatal("no vectors")
	}
	return doc.Entries
}

// Input is the --mount-info string Kata was given: RawInput when set, otherwise MountInfo decoded into a
// T, the type under test, and encoded again, as Kata's AddMountInfo encodes its own struct.
func Input[T any](t testing.TB, v Vector) string {
	t.Helper()
	if v.RawInput != nil {
		return *v.RawInput
	}
	return MustJSON(t, decode[T](t, v.MountInfo))
}

// MustJSON is v's encoding/json, as Kata's Go encodes its structs; an error fails t.
func MustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ReadBack is the mount info Kata read back, decoded into a T, the type under test.
func ReadBack[T any](t testing.TB, v Vector) *T {
	t.Helper()
	return decode[T](t, v.ReadBack)
}

func decode[T any](t testing.TB, data json.RawMessage) *T {
	t.Helper()
	var x T
	if err := json.Unmarshal(data, &x); err != nil {
		t.Fatal(err)
	}
	return &x
}
