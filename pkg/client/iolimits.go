package client

import (
	"math"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

// Volume context keys (StorageClass parameters, which reach the volume context as DeferKey does) that
// cap a deferred volume's I/O in the sandbox. Each value is a whole, non-negative Kubernetes quantity:
// "500", "10Mi", "1G"; "0" or an absent key means no limit. A total limit and a read or write limit of the
// same kind (operations or bytes) are exclusive.
const (
	TotalIOPSKey           = "crust.dev/total-iops"
	ReadIOPSKey            = "crust.dev/read-iops"
	WriteIOPSKey           = "crust.dev/write-iops"
	TotalBytesPerSecondKey = "crust.dev/total-bytes-per-second"
	ReadBytesPerSecondKey  = "crust.dev/read-bytes-per-second"
	WriteBytesPerSecondKey = "crust.dev/write-bytes-per-second"
)

// ioLimitFields pairs each key with the IOLimits field (its proto name) it sets.
var ioLimitFields = []struct {
	key, field string
	set        func(*crustv1.IOLimits, int64)
}{
	{TotalIOPSKey, "total_iops", func(l *crustv1.IOLimits, n int64) { l.TotalIops = n }},
	{ReadIOPSKey, "read_iops", func(l *crustv1.IOLimits, n int64) { l.ReadIops = n }},
	{WriteIOPSKey, "write_iops", func(l *crustv1.IOLimits, n int64) { l.WriteIops = n }},
	{TotalBytesPerSecondKey, "total_bytes_per_second", func(l *crustv1.IOLimits, n int64) { l.TotalBytesPerSecond = n }},
	{ReadBytesPerSecondKey, "read_bytes_per_second", func(l *crustv1.IOLimits, n int64) { l.ReadBytesPerSecond = n }},
	{WriteBytesPerSecondKey, "write_bytes_per_second", func(l *crustv1.IOLimits, n int64) { l.WriteBytesPerSecond = n }},
}

// IOLimitKey returns the key that sets the IOLimits field with the proto name field (such as
// "total_iops"), or field itself when no key does: a caller that checks limits names the key in errors.
func IOLimitKey(field string) string {
	for _, f := range ioLimitFields {
		if f.field == field {
			return f.key
		}
	}
	return field
}

// IOLimitKeys are the keys IOLimits reads, sorted.
func IOLimitKeys() []string {
	keys := make([]string, 0, len(ioLimitFields))
	for _, f := range ioLimitFields {
		keys = append(keys, f.key)
	}
	sort.Strings(keys)
	return keys
}

// IsIOLimitKey reports whether key is one of IOLimitKeys.
func IsIOLimitKey(key string) bool {
	for _, f := range ioLimitFields {
		if f.key == key {
			return true
		}
	}
	return false
}

// IOLimits reads the I/O limit keys of a volume context (or of StorageClass parameters). It returns nil
// when none is set to a non-zero value. A value that is not a whole, non-negative quantity that fits an
// int64 is InvalidArgument naming the key. It checks only the syntax: crustd refuses limits that cannot
// go together or are too large, naming the field.
func IOLimits(volumeContext map[string]string) (*crustv1.IOLimits, error) {
	l := &crustv1.IOLimits{}
	set := false
	for _, f := range ioLimitFields {
		v, ok := volumeContext[f.key]
		if !ok {
			continue
		}
		n, err := parseLimit(v)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %q %s", f.key, v, err.Error())
		}
		f.set(l, n)
		set = set || n != 0
	}
	if !set {
		return nil, nil
	}
	return l, nil
}

// limitError is why a limit does not parse.
type limitError string

func (e limitError) Error() string { return string(e) }

func parseLimit(v string) (int64, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil {
		return 0, limitError(`is not a quantity (a whole number, optionally with a suffix such as "Ki", "Mi", "k" or "M")`)
	}
	if q.Sign() < 0 {
		return 0, limitError("is negative")
	}
	if q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) >= 0 { // ParseQuantity clamps larger values to it
		return 0, limitError("is out of range")
	}
	n := q.Value() // rounded up
	if q.Cmp(*resource.NewQuantity(n, resource.DecimalSI)) != 0 {
		return 0, limitError("is not a whole number") // such as 1.5 or 100m
	}
	return n, nil
}
