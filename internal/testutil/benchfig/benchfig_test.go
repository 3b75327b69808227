package benchfig

import (
	"path/filepath"
	"testing"
)

func TestRecord(t *testing.T) {
	type want struct {
		median, min, max float64
		holds            *bool // nil: no target
	}
	yes, no := true, false
	cases := map[string]struct {
		samples []float64
		target  *Target
		want    want
	}{
		"odd":         {[]float64{3, 1, 2}, AtMost(2), want{2, 1, 3, &yes}},
		"even":        {[]float64{4, 1, 3, 2}, AtMost(2), want{2.5, 1, 4, &no}},
		"at least":    {[]float64{0.3, 0.4, 0.5}, AtLeast(0.35), want{0.4, 0.3, 0.5, &yes}},
		"as measured": {[]float64{7}, nil, want{7, 7, 7, nil}},
	}
	for name, c := range cases {
		f := Record(t, Figure{Name: "test/" + name, Unit: "x", Samples: c.samples, Target: c.target})
		got := want{f.Median, f.Min, f.Max, f.Holds}
		if got.median != c.want.median || got.min != c.want.min || got.max != c.want.max ||
			(got.holds == nil) != (c.want.holds == nil) || (got.holds != nil && *got.holds != *c.want.holds) {
			t.Errorf("%s: recorded %+v, want %+v", name, got, c.want)
		}
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
