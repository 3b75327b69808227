package benchfig

import (
	"path/filepath"
	"testing"
)

func TestRecord(t *testing.T) {
	for _, tc := range []struct {
		name              string
		samples           []float64
		target            *Target
		median, min, max  float64
		holds, withTarget bool
	}{
		{"odd", []float64{3, 1, 2}, AtMost(2), 2, 1, 3, true, true},
		{"even", []float64{4, 1, 3, 2}, AtMost(2), 2.5, 1, 4, false, true},
		{"at least", []float64{0.3, 0.4, 0.5}, AtLeast(0.35), 0.4, 0.3, 0.5, true, true},
		{"as measured", []float64{7}, nil, 7, 7, 7, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Record(t, Figure{Name: "test/" + tc.name, Unit: "x", Samples: tc.samples, Target: tc.target})
			if f.Median != tc.median || f.Min != tc.min || f.Max != tc.max {
				t.Errorf("median, min, max = %v, %v, %v; want %v, %v, %v", f.Median, f.Min, f.Max, tc.median, tc.min, tc.max)
			}
			if (f.Holds != nil) != tc.withTarget || (f.Holds != nil && *f.Holds != tc.holds) {
				t.Errorf("holds = %v, want %v (target %v)", f.Holds, tc.holds, tc.withTarget)
			}
		})
	}
}

func TestWriteReadResults(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(ResultsEnv, dir)
	Record(t, Figure{Name: "test/round-trip", Unit: "ms", Samples: []float64{1, 2, 3}, Target: AtMost(5)})
	if err := WriteResults("unit", "crust.dev/crust/internal/testutil/benchfig"); err != nil {
		t.Fatal(err)
	}
	r, err := ReadResults(filepath.Join(dir, "unit.json"))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, f := range r.Figures {
		if f.Name == "test/round-trip" {
			found = true
			if f.Median != 2 || f.Holds == nil || !*f.Holds || len(f.Samples) != 3 {
				t.Errorf("read back %+v", f)
			}
		}
	}
	if !found {
		t.Errorf("test/round-trip not in %+v", r.Figures)
	}
}

func TestFormat(t *testing.T) {
	for v, want := range map[float64]string{0.0912: "0.0912", 1.5: "1.5", 2: "2", 18.04: "18", 1370: "1370", 250: "250", 50: "50", 0.35: "0.35", 2.5: "2.5"} {
		if got := Format(v); got != want {
			t.Errorf("Format(%v) = %q, want %q", v, got, want)
		}
	}
}
