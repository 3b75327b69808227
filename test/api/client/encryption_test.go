package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// A volume context that asks for encryption puts the key from the publish's secrets in the descriptor's
// metadata (with integrity when asked); a missing or overlong key, a bad encryption or integrity value,
// and an encrypted raw block volume are refused, naming the key or the secret's entry and never the key.
func TestStageRequestEncryption(t *testing.T) {
	const key = "a-key-from-the-node-publish-secret"
	req := func(ctx map[string]string, secrets map[string]string) *csi.NodePublishVolumeRequest {
		r := publishReq("/t", mountCap("", nil, ""), ctx)
		r.Secrets = secrets
		return r
	}
	enc := map[string]string{volume.DeferKey: "true", volume.EncryptionParamKey: "luks2"}
	withIntegrity := map[string]string{volume.EncryptionParamKey: " luks2 ", volume.EncryptionIntegrityKey: "True"}
	for _, tc := range []struct {
		name string
		req  *csi.NodePublishVolumeRequest
		want map[string]string
	}{
		{"no encryption, the secret unused", req(map[string]string{volume.DeferKey: "true"}, map[string]string{volume.EncryptionSecretKey: key}), nil},
		{"luks2", req(enc, map[string]string{volume.EncryptionSecretKey: key, "other": "x"}), map[string]string{volume.EncryptionKey: key}},
		{"luks2 with integrity", req(withIntegrity, map[string]string{volume.EncryptionSecretKey: key}),
			map[string]string{volume.EncryptionKey: key, volume.EncryptionIntegrityKey: "true"}},
		{"integrity false", req(map[string]string{volume.EncryptionParamKey: "luks2", volume.EncryptionIntegrityKey: "false"},
			map[string]string{volume.EncryptionSecretKey: key}), map[string]string{volume.EncryptionKey: key}},
	} {
		got, err := client.StageRequest(tc.req, "/dev/x")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		md := got.GetSpec().GetMetadata()
		for k, v := range tc.want {
			if md[k] != v {
				t.Errorf("%s: metadata %s = %q; want %q", tc.name, k, md[k], v)
			}
		}
		if _, has := md[volume.EncryptionKey]; has != (tc.want != nil) {
			t.Errorf("%s: metadata %v", tc.name, md)
		}
	}

	block := req(enc, map[string]string{volume.EncryptionSecretKey: key})
	block.VolumeCapability = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	for _, tc := range []struct {
		name  string
		req   *csi.NodePublishVolumeRequest
		opts  []client.PublishOption
		field string
	}{
		{"no secret", req(enc, nil), nil, "secrets." + volume.EncryptionSecretKey},
		{"empty key", req(enc, map[string]string{volume.EncryptionSecretKey: ""}), nil, "secrets." + volume.EncryptionSecretKey},
		{"overlong key", req(enc, map[string]string{volume.EncryptionSecretKey: strings.Repeat("k", volume.MaxEncryptionKey+1)}), nil,
			"secrets." + volume.EncryptionSecretKey},
		{"unknown encryption", req(map[string]string{volume.EncryptionParamKey: "aes"}, map[string]string{volume.EncryptionSecretKey: key}), nil,
			volume.EncryptionParamKey},
		{"integrity not a boolean", req(map[string]string{volume.EncryptionParamKey: "luks2", volume.EncryptionIntegrityKey: "yes"},
			map[string]string{volume.EncryptionSecretKey: key}), nil, volume.EncryptionIntegrityKey},
		{"integrity alone", req(map[string]string{volume.EncryptionIntegrityKey: "true"}, nil), nil, volume.EncryptionIntegrityKey},
		{"raw block", block, []client.PublishOption{client.RawBlock()}, volume.EncryptionParamKey},
	} {
		_, err := client.StageRequest(tc.req, "/dev/x", tc.opts...)
		var fe *errdefs.FieldError
		if s := status.Convert(err); s.Code() != codes.InvalidArgument || !errors.As(err, &fe) || fe.Field != tc.field || strings.Contains(s.Message(), key) {
			t.Errorf("%s: %v; want InvalidArgument naming %s, without the key", tc.name, err, tc.field)
		}
	}
}
