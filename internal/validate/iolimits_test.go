package validate

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// TestIOLimits holds the I/O limit cases: through Spec (field named spec.io_limits.*, nothing changed in
// the accepted spec), and through IOLimits with another naming (the CSI proxy names the parameter).
func TestIOLimits(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name          string
		limits        *crustv1.IOLimits
		field, reason string // empty: accepted
	}{
		{name: "none", limits: nil},
		{name: "all zero", limits: &crustv1.IOLimits{}},
		{name: "total of each kind", limits: &crustv1.IOLimits{TotalIops: 50, TotalBytesPerSecond: 1 << 20}},
		{name: "read and write of each kind", limits: &crustv1.IOLimits{ReadIops: 1, WriteIops: 2, ReadBytesPerSecond: 3, WriteBytesPerSecond: 4}},
		{name: "total iops with read and write bytes", limits: &crustv1.IOLimits{TotalIops: 100, ReadBytesPerSecond: 1, WriteBytesPerSecond: 1}},
		{name: "at the maximum", limits: &crustv1.IOLimits{TotalIops: volume.MaxIOLimit, TotalBytesPerSecond: volume.MaxIOLimit}},

		{name: "negative total iops", limits: &crustv1.IOLimits{TotalIops: -1}, field: "spec.io_limits.total_iops", reason: "-1 is negative"},
		{name: "negative write bytes", limits: &crustv1.IOLimits{WriteBytesPerSecond: -1 << 20}, field: "spec.io_limits.write_bytes_per_second", reason: "is negative"},
		{name: "over the maximum", limits: &crustv1.IOLimits{ReadIops: volume.MaxIOLimit + 1}, field: "spec.io_limits.read_iops", reason: "larger than 1000000000000000"},
		{name: "total and read iops", limits: &crustv1.IOLimits{TotalIops: 10, ReadIops: 5}, field: "spec.io_limits.read_iops",
			reason: "cannot be set together with spec.io_limits.total_iops"},
		{name: "total and write iops", limits: &crustv1.IOLimits{TotalIops: 10, WriteIops: 5}, field: "spec.io_limits.write_iops",
			reason: "together with spec.io_limits.total_iops"},
		{name: "total and read bytes", limits: &crustv1.IOLimits{TotalBytesPerSecond: 10, ReadBytesPerSecond: 5}, field: "spec.io_limits.read_bytes_per_second",
			reason: "together with spec.io_limits.total_bytes_per_second"},
		{name: "total and write bytes", limits: &crustv1.IOLimits{TotalBytesPerSecond: 10, WriteBytesPerSecond: 5}, field: "spec.io_limits.write_bytes_per_second",
			reason: "together with spec.io_limits.total_bytes_per_second"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := e.good()
			s.IoLimits = tc.limits
			c, err := e.v.Spec(s)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				want := tc.limits
				if proto.Size(want) == 0 {
					want = nil // zeros are no limit, stored as none
				}
				if !proto.Equal(c.Spec.GetIoLimits(), want) {
					t.Errorf("checked limits %v, want %v", c.Spec.GetIoLimits(), tc.limits)
				}
				return
			}
			var fe *errdefs.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, errdefs.ErrInvalidArgument) || c != nil {
				t.Fatalf("Spec = %v, %v; want a *FieldError and nothing checked", c, err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
				t.Errorf("got %s: %s\nwant %s: ...%s...", fe.Field, fe.Reason, tc.field, tc.reason)
			}
			// Another caller's naming: the name function decides the field, the reason stays.
			err = volume.CheckIOLimits(tc.limits, func(f string) string { return "param/" + f })
			if !errors.As(err, &fe) || fe.Field != "param/"+strings.TrimPrefix(tc.field, "spec.io_limits.") ||
				strings.Contains(fe.Reason, "spec.io_limits") {
				t.Errorf("with another naming: %v", err)
			}
		})
	}
}
