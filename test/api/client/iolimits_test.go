package client_test

import (
	"strings"
	"testing"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestIOLimits reads each key into its field, as plain numbers and as Kubernetes quantities, and refuses
// what is not a whole non-negative quantity, naming the key; StageRequest carries the limits into the spec.
func TestIOLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  map[string]string
		want *crustv1.IOLimits
	}{
		{"none", map[string]string{volume.DeferKey: "true"}, nil},
		{"zeros are no limit", map[string]string{volume.TotalIOPSKey: "0", volume.WriteBytesPerSecondKey: "0Mi"}, nil},
		{"every read and write key", map[string]string{
			volume.ReadIOPSKey: "1k", volume.WriteIOPSKey: " 7 ", volume.ReadBytesPerSecondKey: "1.5Ki", volume.WriteBytesPerSecondKey: "2G",
		}, &crustv1.IOLimits{ReadIops: 1000, WriteIops: 7, ReadBytesPerSecond: 1536, WriteBytesPerSecond: 2_000_000_000}},
		{"every total key", map[string]string{volume.TotalIOPSKey: "50", volume.TotalBytesPerSecondKey: "10Mi"},
			&crustv1.IOLimits{TotalIops: 50, TotalBytesPerSecond: 10 << 20}},
		{"one key", map[string]string{volume.WriteBytesPerSecondKey: "1Mi"}, &crustv1.IOLimits{WriteBytesPerSecond: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := volume.ParseIOLimits(tc.ctx)
			if err != nil || !proto.Equal(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Fatalf("IOLimits = %v, %v; want %v", got, err, tc.want)
			}
			req, err := client.StageRequest(publishReq("/t", mountCap("", nil, ""), tc.ctx), "/dev/x")
			if err != nil || !proto.Equal(req.GetSpec().GetIoLimits(), tc.want) {
				t.Fatalf("StageRequest: %v, io_limits %v; want %v", err, req.GetSpec().GetIoLimits(), tc.want)
			}
		})
	}
	for _, tc := range []struct{ key, value, reason string }{
		{volume.TotalIOPSKey, "-1", "is negative"},
		{volume.ReadIOPSKey, "fast", "is not a quantity"},
		{volume.WriteIOPSKey, "", "is not a quantity"},
		{volume.TotalBytesPerSecondKey, "1.5", "is not a whole number"},
		{volume.ReadBytesPerSecondKey, "100m", "is not a whole number"},
		{volume.WriteBytesPerSecondKey, "10Ei", "is out of range"},
		{volume.WriteBytesPerSecondKey, "-1Mi", "is negative"},
		{volume.WriteIOPSKey, "2", "cannot be set together with " + volume.TotalIOPSKey}, // beside the total below
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			ctx := map[string]string{volume.TotalIOPSKey: "1"} // a valid total, which the write limit below contradicts
			ctx[tc.key] = tc.value
			for _, err := range []error{
				func() error { _, err := volume.ParseIOLimits(ctx); return errdefs.ToGRPC(err) }(),
				func() error {
					_, err := client.StageRequest(publishReq("/t", mountCap("", nil, ""), ctx), "/dev/x")
					return err
				}(),
			} {
				s := status.Convert(err)
				if s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), tc.key+": ") || !strings.Contains(s.Message(), tc.reason) {
					t.Errorf("got %v, want InvalidArgument naming %s: ...%s", err, tc.key, tc.reason)
				}
			}
		})
	}
	if keys := volume.IOLimitKeys(); len(keys) != 6 || !volume.IsIOLimitKey(keys[0]) || volume.IsIOLimitKey(volume.DeferKey) {
		t.Errorf("IOLimitKeys = %v", keys)
	}
	if k := volume.IOLimitKey("write_bytes_per_second"); k != volume.WriteBytesPerSecondKey {
		t.Errorf("IOLimitKey(write_bytes_per_second) = %q", k)
	}
	// Every field of IOLimits has its key.
	fields := (&crustv1.IOLimits{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if f := string(fields.Get(i).Name()); !volume.IsIOLimitKey(volume.IOLimitKey(f)) {
			t.Errorf("no key sets io_limits.%s", f)
		}
	}
}
