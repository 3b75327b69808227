package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/internal/testutil/benchfig"
)

// The table names every figure of every results file with its median, spread, target and verdict, and
// the benchmark format gives one line a sample under the figure's area.
func TestTableAndBenchfmt(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(benchfig.ResultsEnv, dir)
	benchfig.Record(t, benchfig.Figure{Name: "control/pair-vs-x", Unit: "x", Samples: []float64{5, 3, 4}, Target: benchfig.AtMost(4.5), About: "a"})
	benchfig.Record(t, benchfig.Figure{Name: "scale/rss", Unit: "MiB", Samples: []float64{50, 60}, Target: benchfig.AtMost(48), About: "b"})
	benchfig.Record(t, benchfig.Figure{Name: "vm/ms", Unit: "ms", Samples: []float64{7}, About: "c"})
	if err := benchfig.WriteResults("one", "p"); err != nil {
		t.Fatal(err)
	}
	figs, err := load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := writeTable(&table, figs); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"control/pair-vs-x  4 x", "3–5, 3", "<= 4.5 x", "yes", "scale/rss", "55 MiB", "NO",
		"vm/ms", "as measured", "3 figures, 2 with a target, 1 missed"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, table.String())
		}
	}
	var bf bytes.Buffer
	if err := writeBenchfmt(&bf, figs); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(bf.String(), "BenchmarkControl 1 "); got != 3 || !strings.Contains(bf.String(), "BenchmarkScale 1 50 rss-MiB\n") {
		t.Errorf("benchmark format:\n%s", bf.String())
	}
	if _, err := load([]string{filepath.Join(dir, "missing.json")}); err == nil {
		t.Error("a missing file loaded")
	}
	var out, errs bytes.Buffer
	if code := run([]string{"-strict", dir}, &out, &errs); code != 1 || !strings.Contains(out.String(), "1 missed") {
		t.Errorf("-strict with a missed target: exit %d, output %q %q", code, out.String(), errs.String())
	}
	out.Reset()
	if code := run([]string{"-plot", "control/", dir}, &out, &errs); code != 0 || !strings.Contains(out.String(), "<svg") ||
		!strings.Contains(out.String(), "pair-vs-x") || strings.Contains(out.String(), "rss") {
		t.Errorf("-plot control/: exit %d, %q", code, out.String())
	}
	if code := run(nil, &out, &errs); code != 2 || !strings.Contains(errs.String(), "usage") {
		t.Errorf("no arguments: exit %d, %q", code, errs.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "other.json"), []byte(`{"version":99}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := load([]string{dir}); err == nil || !strings.Contains(err.Error(), "results version 99") {
		t.Errorf("another results version: %v", err)
	}
}
