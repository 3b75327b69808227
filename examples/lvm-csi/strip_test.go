package csidriver_test

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	csidriver "crust.dev/crust/examples/lvm-csi"
)

// Every field the CSI spec marks csi_secret is stripped, at any depth, and the request itself is untouched.
func TestStripSecrets(t *testing.T) {
	for _, m := range []proto.Message{
		&csi.NodeStageVolumeRequest{VolumeId: "v", Secrets: map[string]string{"password": "hunter2"}},
		&csi.NodePublishVolumeRequest{VolumeId: "v", Secrets: map[string]string{"token": "hunter2"}},
		&csi.CreateVolumeRequest{Name: "n", Secrets: map[string]string{"key": "hunter2"}, MutableParameters: map[string]string{"a": "b"}},
		&csi.ControllerExpandVolumeRequest{VolumeId: "v", Secrets: map[string]string{"k": "hunter2"}},
	} {
		orig := proto.Clone(m)
		out := prototext.Format(csidriver.StripSecrets(m))
		if strings.Contains(out, "hunter2") || !strings.Contains(out, csidriver.Stripped) {
			t.Errorf("%T: secrets not stripped: %s", m, out)
		}
		if !proto.Equal(m, orig) {
			t.Errorf("%T: the request itself was changed", m)
		}
	}
}
