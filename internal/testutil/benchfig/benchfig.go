// Package benchfig collects the figures crust's benchmarks measure and writes them as results files, so
// that `make bench` prints every figure in one table with its target (hack/benchtable) and two commits'
// results can be compared with benchstat.
//
// A figure is a set of samples, one per round, of one quantity: most are ratios of two things measured
// side by side in the same round, since the machines these benchmarks run on are too noisy for absolute
// figures to mean much. Record reduces the samples to their median and spread (min and max), checks the
// median against the figure's target, and reports the median as a benchmark metric. WriteResults, called
// once the benchmarks have run (from TestMain), writes what was recorded.
//
// # Results format
//
// $CRUST_BENCH_RESULTS/<name>.json, one JSON object (written only when CRUST_BENCH_RESULTS is set):
//
//	{"version":1,"package":"<import path>","figures":[<figure>...]}
//
// where each <figure> is a Figure as its JSON tags name it. The samples are kept, not only their median,
// so that benchstat compares two runs by their distributions (hack/benchtable -benchfmt writes them in
// the Go benchmark format benchstat reads).
package benchfig

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// ResultsEnv names the environment variable holding the directory results files are written to.
const ResultsEnv = "CRUST_BENCH_RESULTS"

// ResultsVersion is the version of the results format this package writes.
const ResultsVersion = 1

// Target is what a figure must reach: its median compared with Value by Op.
type Target struct {
	Op    string  `json:"op"` // "<=" or ">="
	Value float64 `json:"value"`
}

// AtMost is a target the median must not exceed.
func AtMost(v float64) *Target { return &Target{Op: "<=", Value: v} }

// AtLeast is a target the median must reach.
func AtLeast(v float64) *Target { return &Target{Op: ">=", Value: v} }

// Holds says whether value meets t.
func (t *Target) Holds(value float64) bool {
	if t.Op == ">=" {
		return value >= t.Value
	}
	return value <= t.Value
}

func (t *Target) String() string { return fmt.Sprintf("%s %s", t.Op, Format(t.Value)) }

// Figure is one measured quantity.
type Figure struct {
	// Name identifies the figure across runs, as "area/what", such as "control/pair-vs-kata-lib".
	Name string `json:"name"`
	// Unit of the samples: "x" for a ratio, or "ms", "us", "MiB", "s", "ops/s"...
	Unit string `json:"unit"`
	// About says in one line what was measured against what.
	About string `json:"about"`
	// Samples are the values measured, one per round.
	Samples []float64 `json:"samples"`
	// Median, Min and Max are computed by Record from Samples.
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Target is what the median must reach; nil for a figure reported as measured.
	Target *Target `json:"target,omitempty"`
	// Holds says whether the median meets Target; absent without one.
	Holds *bool `json:"holds,omitempty"`
}

var recorded struct {
	mu      sync.Mutex
	figures []Figure
}

// Record completes f from its samples (median, spread, whether its target holds), keeps it for
// WriteResults, and reports its median as a metric of b. A figure without samples is an error of the
// benchmark. Recording a name again replaces the earlier figure: the last run of a benchmark counts.
func Record(b testing.TB, f Figure) Figure {
	b.Helper()
	if len(f.Samples) == 0 {
		b.Fatalf("figure %s has no samples", f.Name)
	}
	s := slices.Clone(f.Samples)
	slices.Sort(s)
	f.Min, f.Max = s[0], s[len(s)-1]
	if n := len(s); n%2 == 1 {
		f.Median = s[n/2]
	} else {
		f.Median = (s[n/2-1] + s[n/2]) / 2
	}
	if f.Target != nil {
		h := f.Target.Holds(f.Median)
		f.Holds = &h
	}
	if bb, ok := b.(*testing.B); ok {
		bb.ReportMetric(f.Median, MetricUnit(f))
	}
	b.Logf("%s = %s %s (min %s, max %s, %d samples)%s", f.Name, Format(f.Median), f.Unit, Format(f.Min), Format(f.Max),
		len(f.Samples), verdict(f))
	recorded.mu.Lock()
	defer recorded.mu.Unlock()
	recorded.figures = slices.DeleteFunc(recorded.figures, func(g Figure) bool { return g.Name == f.Name })
	recorded.figures = append(recorded.figures, f)
	return f
}

func verdict(f Figure) string {
	if f.Holds == nil {
		return ""
	}
	if *f.Holds {
		return "; target " + f.Target.String() + " holds"
	}
	return "; target " + f.Target.String() + " MISSED"
}

// MetricUnit is the benchmark metric unit of f: its name's last part and its unit, with no white space.
func MetricUnit(f Figure) string {
	name := f.Name[strings.LastIndexByte(f.Name, '/')+1:]
	if f.Unit == "" {
		return name
	}
	return name + "-" + strings.ReplaceAll(f.Unit, "/", "per")
}

// Format prints v with three significant digits, or as a whole number when it is large.
func Format(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000 || a == math.Trunc(a) && a >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		s := fmt.Sprintf("%.3g", v)
		if strings.Contains(s, ".") && !strings.Contains(s, "e") {
			s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
		}
		return s
	}
}

// Results is the content of a results file.
type Results struct {
	Version int      `json:"version"`
	Package string   `json:"package"`
	Figures []Figure `json:"figures"`
}

// WriteResults writes what Record kept, for package pkg, to $CRUST_BENCH_RESULTS/<name>.json, replacing
// the file; without CRUST_BENCH_RESULTS, or with nothing recorded, it writes nothing and is not an error.
func WriteResults(name, pkg string) error {
	dir := os.Getenv(ResultsEnv)
	recorded.mu.Lock()
	figs := slices.Clone(recorded.figures)
	recorded.mu.Unlock()
	if dir == "" || len(figs) == 0 {
		return nil
	}
	data, err := json.MarshalIndent(Results{Version: ResultsVersion, Package: pkg, Figures: figs}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), append(data, '\n'), 0o644)
}

// scratch is the process's directory for what its benchmarks build (ScratchDir).
var scratch struct {
	mu  sync.Mutex
	dir string
}

// ScratchDir returns a directory for what the process's benchmarks build (binaries, guest images), the
// same one at every call, made at the first. RunMain removes it when the benchmarks are done.
func ScratchDir() (string, error) {
	scratch.mu.Lock()
	defer scratch.mu.Unlock()
	if scratch.dir == "" {
		dir, err := os.MkdirTemp("", "crust-bench-")
		if err != nil {
			return "", err
		}
		scratch.dir = dir
	}
	return scratch.dir, nil
}

// RunMain runs a benchmark package's tests and benchmarks (m.Run), writes what they recorded as the
// results file name of package pkg (WriteResults) and removes ScratchDir's directory, and returns the
// exit code for os.Exit: m.Run's, or 1 when the results cannot be written.
func RunMain(m *testing.M, name, pkg string) int {
	code := m.Run()
	scratch.mu.Lock()
	if scratch.dir != "" {
		_ = os.RemoveAll(scratch.dir)
		scratch.dir = ""
	}
	scratch.mu.Unlock()
	if err := WriteResults(name, pkg); err != nil {
		fmt.Fprintln(os.Stderr, "writing the results:", err)
		return 1
	}
	return code
}

// ReadResults reads a results file, refusing another format version.
func ReadResults(path string) (*Results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Version != ResultsVersion {
		return nil, fmt.Errorf("%s: results version %d, this code reads %d", path, r.Version, ResultsVersion)
	}
	return &r, nil
}
