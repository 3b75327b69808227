package volume_test

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/volume"
)

// Every field the CSI spec marks csi_secret is stripped, at any depth, and the request itself is untouched.
func TestStripSecretsCSI(t *testing.T) {
	for _, m := range []proto.Message{
		&csi.NodeStageVolumeRequest{VolumeId: "v", Secrets: map[string]string{"password": "hunter2"}},
		&csi.NodePublishVolumeRequest{VolumeId: "v", Secrets: map[string]string{"token": "hunter2"}},
		&csi.CreateVolumeRequest{Name: "n", Secrets: map[string]string{"key": "hunter2"}, MutableParameters: map[string]string{"a": "b"}},
		&csi.ControllerExpandVolumeRequest{VolumeId: "v", Secrets: map[string]string{"k": "hunter2"}},
	} {
		orig := proto.Clone(m)
		out := prototext.Format(volume.StripSecrets(m))
		if strings.Contains(out, "hunter2") || !strings.Contains(out, volume.Redacted) {
			t.Errorf("%T: secrets not stripped: %s", m, out)
		}
		if !proto.Equal(m, orig) {
			t.Errorf("%T: the request itself was changed", m)
		}
	}
}

// Secret-looking keys of string maps are stripped too, the other values kept.
func TestStripSecretsKeys(t *testing.T) {
	r := &csi.NodeStageVolumeRequest{VolumeId: "v", Secrets: map[string]string{"a": "1", "b": "2"},
		VolumeContext: map[string]string{"c": "3", "csi.storage.k8s.io/serviceAccount.tokens": `{"aud":{"token":"t"}}`,
			"encryptionKey": "k"},
		PublishContext: map[string]string{"devicePath": "/dev/sdb", "diskPassword": "p"}}
	got := volume.StripSecrets(r).(*csi.NodeStageVolumeRequest)
	if got.GetSecrets()["a"] != volume.Redacted || got.GetSecrets()["b"] != volume.Redacted || got.GetVolumeContext()["c"] != "3" {
		t.Fatalf("stripped: %v", got)
	}
	// Secret-looking keys of the string maps CSI does not mark: kubelet's service account tokens, a key.
	if vc, pc := got.GetVolumeContext(), got.GetPublishContext(); vc["csi.storage.k8s.io/serviceAccount.tokens"] != volume.Redacted ||
		vc["encryptionKey"] != volume.Redacted || pc["diskPassword"] != volume.Redacted || pc["devicePath"] != "/dev/sdb" {
		t.Fatalf("volume context %v, publish context %v: want the secret-looking values stripped, the others kept", vc, pc)
	}
	if r.GetSecrets()["a"] != "1" || r.GetVolumeContext()["encryptionKey"] != "k" {
		t.Fatal("the original was modified")
	}
}

// crustd logs a StageVolumeRequest through the same function: secret metadata is redacted, the rest kept,
// and a request with no secret is returned as it is.
func TestStripSecretsStage(t *testing.T) {
	r := &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{VolumeTargetPath: "/t",
		Metadata: map[string]string{volume.EncryptionKey: "hunter2", volume.PodNameKey: "web-0"}}}
	got := volume.StripSecrets(r).(*crustv1.StageVolumeRequest)
	if md := got.GetSpec().GetMetadata(); md[volume.EncryptionKey] != volume.Redacted || md[volume.PodNameKey] != "web-0" ||
		got.GetSpec().GetVolumeTargetPath() != "/t" {
		t.Fatalf("stripped: %v", got)
	}
	if r.GetSpec().GetMetadata()[volume.EncryptionKey] != "hunter2" {
		t.Fatal("the original was modified")
	}
	plain := &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{VolumeTargetPath: "/t"}}
	if volume.StripSecrets(plain) != proto.Message(plain) || volume.StripSecrets(nil) != nil {
		t.Fatal("a message without secrets was copied")
	}
}
