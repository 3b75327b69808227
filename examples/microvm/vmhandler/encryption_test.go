package vmhandler

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
	crustvolume "crust.dev/crust/api/volume"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// A descriptor's encryptionKey becomes the guest's LUKS2 key, with integrity when its metadata asks;
// Kata's ephemeral key and encrypted raw block or persistent-memory volumes are refused, without the key
// in the refusal.
func TestEncryption(t *testing.T) {
	const key = "the-volume-key"
	spec := func(md map[string]string) *crustv1.VolumeSpec { return &crustv1.VolumeSpec{Metadata: md} }
	for _, tc := range []struct {
		name string
		spec *crustv1.VolumeSpec
		v    *volume
		want *agentv1.Encryption
	}{
		{"no key", spec(map[string]string{"csi.storage.k8s.io/pod.name": "p"}), &volume{}, nil},
		{"a key", spec(map[string]string{kata.MetadataEncryptionKey: key}), &volume{}, &agentv1.Encryption{Key: []byte(key)}},
		{"with integrity", spec(map[string]string{kata.MetadataEncryptionKey: key, crustvolume.EncryptionIntegrityKey: "true"}), &volume{},
			&agentv1.Encryption{Key: []byte(key), Integrity: true}},
		{"integrity false", spec(map[string]string{kata.MetadataEncryptionKey: key, crustvolume.EncryptionIntegrityKey: "false"}), &volume{},
			&agentv1.Encryption{Key: []byte(key)}},
	} {
		got, err := encryption(tc.spec, tc.v)
		if err != nil || !proto.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name, key string
		v         *volume
		why       string
	}{
		{"ephemeral", "ephemeral", &volume{}, "ephemeral key"},
		{"raw block", key, &volume{block: true}, "filesystem volumes on disks only"},
		{"pmem", key, &volume{pmem: true}, "filesystem volumes on disks only"},
	} {
		_, err := encryption(spec(map[string]string{kata.MetadataEncryptionKey: tc.key}), tc.v)
		if err == nil || !strings.Contains(err.Error(), tc.why) || tc.key != "ephemeral" && strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %v; want a refusal saying %q, without the key", tc.name, err, tc.why)
		}
	}
}
