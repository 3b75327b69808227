package validate

import (
	crustv1 "crust.dev/crust/pkg/api/crust/v1"
	"crust.dev/crust/pkg/errdefs"
)

// MaxIOLimit is the largest I/O limit accepted, in operations or bytes per second: QEMU's largest throttle
// value (10^15), so that a handler built on QEMU can apply every limit crustd accepts. Larger is no limit
// in practice; leave it zero.
const MaxIOLimit = 1_000_000_000_000_000

// IOLimits checks I/O limits: each at least 0 and at most MaxIOLimit, and a total limit not set together
// with a read or write limit of the same kind (operations, bytes), as QEMU requires: a total caps reads
// and writes together, so a read or write cap beside it would be ambiguous. Nil limits pass. A refusal is a
// *errdefs.FieldError whose field is name applied to the limit's field name ("total_iops", ...), so that a
// caller names the request field or the StorageClass parameter it came from.
func IOLimits(l *crustv1.IOLimits, name func(field string) string) error {
	if l == nil {
		return nil
	}
	limits := []struct {
		field string
		v     int64
	}{
		{"total_iops", l.GetTotalIops()}, {"read_iops", l.GetReadIops()}, {"write_iops", l.GetWriteIops()},
		{"total_bytes_per_second", l.GetTotalBytesPerSecond()}, {"read_bytes_per_second", l.GetReadBytesPerSecond()},
		{"write_bytes_per_second", l.GetWriteBytesPerSecond()},
	}
	for _, f := range limits {
		switch {
		case f.v < 0:
			return errdefs.Field(name(f.field), "%d is negative (0 means no limit)", f.v)
		case f.v > MaxIOLimit:
			return errdefs.Field(name(f.field), "%d is larger than %d, the largest limit QEMU applies", f.v, int64(MaxIOLimit))
		}
	}
	for i := 0; i < len(limits); i += 3 {
		total, read, write := limits[i], limits[i+1], limits[i+2]
		if total.v == 0 {
			continue
		}
		for _, other := range []struct {
			field string
			v     int64
		}{read, write} {
			if other.v != 0 {
				return errdefs.Field(name(other.field), "cannot be set together with %s: a total limit caps reads and writes together",
					name(total.field))
			}
		}
	}
	return nil
}
