package volume

import (
	"math"
	"math/big"
	"regexp"
	"sort"
	"strconv"
	"strings"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// StorageClass parameters (which reach the volume context as DeferKey does) that cap a deferred
// volume's I/O in the sandbox. Each value is a whole, non-negative Kubernetes quantity: "500", "10Mi",
// "1G"; "0" or an absent key means no limit.
const (
	TotalIOPSKey           = "crust.dev/total-iops"
	ReadIOPSKey            = "crust.dev/read-iops"
	WriteIOPSKey           = "crust.dev/write-iops"
	TotalBytesPerSecondKey = "crust.dev/total-bytes-per-second"
	ReadBytesPerSecondKey  = "crust.dev/read-bytes-per-second"
	WriteBytesPerSecondKey = "crust.dev/write-bytes-per-second"
)

// MaxIOLimit is the largest I/O limit accepted, in operations or bytes per second: QEMU's largest throttle
// value (10^15), so that a handler built on QEMU can apply every limit crustd accepts. Larger is no limit
// in practice; leave it zero.
const MaxIOLimit = 1_000_000_000_000_000

// ioLimitFields pairs each key with the IOLimits field (its proto name) it sets, in groups of three of
// one kind (operations, bytes): total, read, write.
var ioLimitFields = []struct {
	key, field string
	get        func(*crustv1.IOLimits) int64
	set        func(*crustv1.IOLimits, int64)
}{
	{TotalIOPSKey, "total_iops", (*crustv1.IOLimits).GetTotalIops, func(l *crustv1.IOLimits, n int64) { l.TotalIops = n }},
	{ReadIOPSKey, "read_iops", (*crustv1.IOLimits).GetReadIops, func(l *crustv1.IOLimits, n int64) { l.ReadIops = n }},
	{WriteIOPSKey, "write_iops", (*crustv1.IOLimits).GetWriteIops, func(l *crustv1.IOLimits, n int64) { l.WriteIops = n }},
	{TotalBytesPerSecondKey, "total_bytes_per_second", (*crustv1.IOLimits).GetTotalBytesPerSecond,
		func(l *crustv1.IOLimits, n int64) { l.TotalBytesPerSecond = n }},
	{ReadBytesPerSecondKey, "read_bytes_per_second", (*crustv1.IOLimits).GetReadBytesPerSecond,
		func(l *crustv1.IOLimits, n int64) { l.ReadBytesPerSecond = n }},
	{WriteBytesPerSecondKey, "write_bytes_per_second", (*crustv1.IOLimits).GetWriteBytesPerSecond,
		func(l *crustv1.IOLimits, n int64) { l.WriteBytesPerSecond = n }},
}

// IOLimitKey returns the key that sets the IOLimits field with the proto name field (such as
// "total_iops"), or field itself when no key does. Given to CheckIOLimits, it makes refusals name keys.
func IOLimitKey(field string) string {
	for _, f := range ioLimitFields {
		if f.field == field {
			return f.key
		}
	}
	return field
}

// IOLimitKeys are the I/O limit keys, sorted.
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

// ParseIOLimits reads the I/O limit keys of a volume context (or of StorageClass parameters) and checks
// the limits with CheckIOLimits. It returns nil when none is set to a non-zero value. A value that is not
// a whole, non-negative quantity that fits an int64, or limits CheckIOLimits refuses, give a
// *errdefs.FieldError naming the key.
func ParseIOLimits(volumeContext map[string]string) (*crustv1.IOLimits, error) {
	l := &crustv1.IOLimits{}
	set := false
	for _, f := range ioLimitFields {
		v, ok := volumeContext[f.key]
		if !ok {
			continue
		}
		n, why := parseLimit(v)
		if why != "" {
			return nil, errdefs.Field(f.key, "%q %s", v, why)
		}
		f.set(l, n)
		set = set || n != 0
	}
	if !set {
		return nil, nil
	}
	if err := CheckIOLimits(l, IOLimitKey); err != nil {
		return nil, err
	}
	return l, nil
}

// parseLimit returns the value of a limit, or why it is not one. A limit is written as a Kubernetes
// quantity (resource.Quantity's grammar: a number, then a binary suffix Ki to Ei, a decimal suffix m, k,
// M, G, T, P or E, or an exponent e3 or E3) whose value is a whole number below 2^63. It is read here
// rather than with k8s.io/apimachinery so that the API module does not depend on it; a fuzz test in
// internal/validate holds the two to the same answers.
func parseLimit(v string) (int64, string) {
	const notQuantity = `is not a quantity (a whole number, optionally with a suffix such as "Ki", "Mi", "k" or "M")`
	v = strings.TrimSpace(v)
	m := quantityRE.FindStringSubmatch(v)
	if m == nil || v == "" {
		return 0, notQuantity
	}
	num := m[2] + strings.TrimSuffix(m[3], ".")
	if num == "" {
		num = "0" // as apimachinery reads "k", "+" or "."
	}
	q, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, notQuantity
	}
	switch suffix := m[4]; {
	case suffix == "":
	case suffix[0] == 'e' || suffix[0] == 'E':
		exp, err := strconv.Atoi(suffix[1:])
		if err != nil || exp > 100 || exp < -100 { // far beyond any int64 or any whole fraction
			if q.Sign() == 0 {
				break
			}
			if strings.HasPrefix(suffix[1:], "-") {
				return 0, "is not a whole number"
			}
			return 0, "is out of range"
		}
		q.Mul(q, pow(10, int64(exp)))
	default:
		q.Mul(q, quantitySuffixes[suffix])
	}
	if m[1] == "-" && q.Sign() != 0 {
		return 0, "is negative"
	}
	if q.Cmp(new(big.Rat).SetInt64(math.MaxInt64)) >= 0 {
		return 0, "is out of range"
	}
	if !q.IsInt() {
		return 0, "is not a whole number" // such as 1.5 or 100m
	}
	return q.Num().Int64(), ""
}

// quantityRE is a quantity: sign, whole digits, fraction, suffix.
var quantityRE = regexp.MustCompile(`^([+-]?)([0-9]*)(\.[0-9]*)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$`)

// quantitySuffixes are the multipliers of the binary and decimal suffixes.
var quantitySuffixes = map[string]*big.Rat{
	"Ki": pow(2, 10), "Mi": pow(2, 20), "Gi": pow(2, 30), "Ti": pow(2, 40), "Pi": pow(2, 50), "Ei": pow(2, 60),
	"m": pow(10, -3), "k": pow(10, 3), "M": pow(10, 6), "G": pow(10, 9), "T": pow(10, 12), "P": pow(10, 15), "E": pow(10, 18),
}

// pow returns base^exp as a rational.
func pow(base, exp int64) *big.Rat {
	p := new(big.Int).Exp(big.NewInt(base), big.NewInt(max(exp, -exp)), nil)
	if exp < 0 {
		return new(big.Rat).SetFrac(big.NewInt(1), p)
	}
	return new(big.Rat).SetInt(p)
}

// CheckIOLimits checks I/O limits: each at least 0 and at most MaxIOLimit, and a total limit not set
// together with a read or write limit of the same kind (operations, bytes), as QEMU requires: a total caps
// reads and writes together, so a read or write cap beside it would be ambiguous. Nil limits pass. A
// refusal is a *errdefs.FieldError whose field is name applied to the limit's field name ("total_iops",
// ...), so that a caller names the request field or the parameter it came from (IOLimitKey).
func CheckIOLimits(l *crustv1.IOLimits, name func(field string) string) error {
	if l == nil {
		return nil
	}
	for _, f := range ioLimitFields {
		switch v := f.get(l); {
		case v < 0:
			return errdefs.Field(name(f.field), "%d is negative (0 means no limit)", v)
		case v > MaxIOLimit:
			return errdefs.Field(name(f.field), "%d is larger than %d, the largest limit QEMU applies", v, int64(MaxIOLimit))
		}
	}
	for i := 0; i < len(ioLimitFields); i += 3 {
		total := ioLimitFields[i]
		if total.get(l) == 0 {
			continue
		}
		for _, other := range ioLimitFields[i+1 : i+3] {
			if other.get(l) != 0 {
				return errdefs.Field(name(other.field), "cannot be set together with %s: a total limit caps reads and writes together",
					name(total.field))
			}
		}
	}
	return nil
}
