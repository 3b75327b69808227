package validate

import (
	"math"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"crust.dev/crust/api/volume"
)

// FuzzIOLimitQuantity holds the API module's reading of an I/O limit (api/volume, which must not depend on
// k8s.io/apimachinery) to apimachinery's: a value is a limit exactly when resource.ParseQuantity reads it
// as a whole, non-negative number below 2^63, with the same value.
func FuzzIOLimitQuantity(f *testing.F) {
	for _, s := range []string{"0", "500", "10Mi", "1G", "1.5", "1.5Ki", "100m", "1000m", "-1", "-0", "+5", "1e3",
		"1E3", "1e-3", "5e-1", "1e18", "9223372036854775807", "9223372036854775806", "8Ei", "7Ei", ".5k", "5.", ".",
		"", " 7 ", "1e", "k", "1Kii", "0.000001M", "1e100", "0e999", "1e+3", "12.3e1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		want, ok := apimachineryLimit(v)
		l, err := volume.ParseIOLimits(map[string]string{volume.TotalIOPSKey: v})
		switch {
		case !ok || want > volume.MaxIOLimit:
			if err == nil {
				t.Fatalf("%q: got %v, want a refusal (apimachinery: %d, %v)", v, l, want, ok)
			}
		case err != nil:
			t.Fatalf("%q: %v, want %d", v, err, want)
		case l.GetTotalIops() != want:
			t.Fatalf("%q: got %d, want %d", v, l.GetTotalIops(), want)
		}
	})
}

// apimachineryLimit reads v as a limit with apimachinery: its value, and whether it is a whole,
// non-negative quantity below 2^63.
func apimachineryLimit(v string) (int64, bool) {
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	if err != nil || q.Sign() < 0 || q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) >= 0 {
		return 0, false
	}
	n := q.Value()
	return n, q.Cmp(*resource.NewQuantity(n, resource.DecimalSI)) == 0
}
