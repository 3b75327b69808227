package client_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
	"crust.dev/crust/pkg/client"
)

// TestIOLimits reads each key into its field, as plain numbers and as Kubernetes quantities, and refuses
// what is not a whole non-negative quantity, naming the key; StageRequest carries the limits into the spec.
func TestIOLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  map[string]string
		want *crustv1.IOLimits
	}{
		{"none", map[string]string{client.DeferKey: "true"}, nil},
		{"zeros are no limit", map[string]string{client.TotalIOPSKey: "0", client.WriteBytesPerSecondKey: "0Mi"}, nil},
		{"every key", map[string]string{
			client.TotalIOPSKey: "50", client.ReadIOPSKey: "1k", client.WriteIOPSKey: " 7 ",
			client.TotalBytesPerSecondKey: "10Mi", client.ReadBytesPerSecondKey: "1.5Ki", client.WriteBytesPerSecondKey: "2G",
		}, &crustv1.IOLimits{TotalIops: 50, ReadIops: 1000, WriteIops: 7, TotalBytesPerSecond: 10 << 20,
			ReadBytesPerSecond: 1536, WriteBytesPerSecond: 2_000_000_000}},
		{"one key", map[string]string{client.WriteBytesPerSecondKey: "1Mi"}, &crustv1.IOLimits{WriteBytesPerSecond: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := client.IOLimits(tc.ctx)
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
		{client.TotalIOPSKey, "-1", "is negative"},
		{client.ReadIOPSKey, "fast", "is not a quantity"},
		{client.WriteIOPSKey, "", "is not a quantity"},
		{client.TotalBytesPerSecondKey, "1.5", "is not a whole number"},
		{client.ReadBytesPerSecondKey, "100m", "is not a whole number"},
		{client.WriteBytesPerSecondKey, "10Ei", "is out of range"},
		{client.WriteBytesPerSecondKey, "-1Mi", "is negative"},
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			ctx := map[string]string{tc.key: tc.value}
			for _, err := range []error{
				func() error { _, err := client.IOLimits(ctx); return err }(),
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
	if keys := client.IOLimitKeys(); len(keys) != 6 || !client.IsIOLimitKey(keys[0]) || client.IsIOLimitKey(client.DeferKey) {
		t.Errorf("IOLimitKeys = %v", keys)
	}
	if k := client.IOLimitKey("write_bytes_per_second"); k != client.WriteBytesPerSecondKey {
		t.Errorf("IOLimitKey(write_bytes_per_second) = %q", k)
	}
	// Every field of IOLimits has its key.
	fields := (&crustv1.IOLimits{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if f := string(fields.Get(i).Name()); !client.IsIOLimitKey(client.IOLimitKey(f)) {
			t.Errorf("no key sets io_limits.%s", f)
		}
	}
}
