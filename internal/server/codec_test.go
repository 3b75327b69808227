package server

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// A request that does not decode must become INVALID_ARGUMENT naming the field, not gRPC's INTERNAL.
func TestRequestCodecNamesTheUndecodableField(t *testing.T) {
	str := func(num protowire.Number, v string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	msg := func(num protowire.Number, parts ...[]byte) []byte {
		var inner []byte
		for _, p := range parts {
			inner = append(inner, p...)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), inner)
	}
	good := msg(1, str(1, "/var/lib/kubelet/pods/x/mount"), str(2, "/dev/loop0"), str(4, "ext4"))
	for _, tc := range []struct {
		name  string
		b     []byte
		field string // "" for a refusal that names no field
		sub   string // in the refusal; "" when the request decodes
	}{
		{"a good request", good, "", ""},
		{"target not UTF-8", msg(1, str(1, "/var/lib/kubelet/\xff"), str(4, "ext4")), "spec.volume_target_path", "is not valid UTF-8"},
		{"backing path not UTF-8", msg(1, str(2, "/dev/loop\xfe")), "spec.volume_backing_path", "is not valid UTF-8"},
		{"a metadata key not UTF-8", msg(1, msg(13, str(1, "k\xff"), str(2, "v"))), "spec.metadata.key", "is not valid UTF-8"},
		{"a mount flag not UTF-8", msg(1, str(5, "noatime"), str(5, "\xc0")), "spec.mount_flags", "is not valid UTF-8"},
		{"not a message", []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, "", "is not a valid crust.v1.StageVolumeRequest message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newRequestCodec()
			req := &crustv1.StageVolumeRequest{}
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, req); err != nil {
				t.Fatalf("Unmarshal = %v; it must leave the refusal to the interceptor", err)
			}
			err := c.take(req)
			if tc.sub == "" {
				if err != nil || req.GetSpec().GetFsType() != "ext4" {
					t.Fatalf("take = %v, request %v", err, req)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.sub) {
				t.Fatalf("take = %v; want invalid argument with %q", err, tc.sub)
			}
			var fe *errdefs.FieldError
			if tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field) {
				t.Errorf("take = %v; want field %s", err, tc.field)
			}
			if !proto.Equal(req, &crustv1.StageVolumeRequest{}) {
				t.Errorf("a refused request was half decoded: %v", req)
			}
			if again := c.take(req); again != nil {
				t.Errorf("the refusal was kept after it was taken: %v", again)
			}
		})
	}
}
