// Command benchtable prints the figures of crust's benchmark results (internal/testutil/benchfig) as one
// table, each with its spread, its target and whether the target holds; with -benchfmt it writes them in
// the Go benchmark format instead, one line a sample, for benchstat to compare two runs:
//
//	go run ./hack/benchtable bench/results
//	go run ./hack/benchtable -benchfmt bench/results > new.txt && benchstat old.txt new.txt
//	go run ./hack/benchtable -plot datapath/ bench/results > docs/performance-datapath.svg
//
// It exits 1 when a figure misses its target and -strict is given.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"crust.dev/crust/internal/testutil/benchfig"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the command with its arguments; it returns the exit code: 2 for bad usage or unreadable
// results, 1 for a missed target under -strict.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchtable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	benchfmt := fs.Bool("benchfmt", false, "write the samples in the Go benchmark format, for benchstat")
	strict := fs.Bool("strict", false, "exit 1 when a figure misses its target")
	plot := fs.String("plot", "", "draw the ratio figures whose names start with this prefix as an SVG chart, instead of the table")
	if fs.Parse(args) != nil {
		return 2
	}
	figs, err := load(fs.Args())
	if err == nil {
		write := writeTable
		switch {
		case *benchfmt:
			write = writeBenchfmt
		case *plot != "":
			write = func(w io.Writer, figs []benchfig.Figure) error { return writePlot(w, figs, *plot) }
		}
		err = write(stdout, figs)
	}
	if err != nil {
		fmt.Fprintln(stderr, "benchtable:", err)
		return 2
	}
	if *strict && slices.ContainsFunc(figs, func(f benchfig.Figure) bool { return f.Holds != nil && !*f.Holds }) {
		return 1
	}
	return 0
}

// load reads the results files named, a directory meaning every *.json in it, and returns their figures
// sorted by name.
func load(args []string) ([]benchfig.Figure, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("no results named (usage: benchtable [-benchfmt] [-strict] DIR|FILE.json)")
	}
	var files []string
	for _, a := range args {
		if st, err := os.Stat(a); err == nil && st.IsDir() {
			m, err := filepath.Glob(filepath.Join(a, "*.json"))
			if err != nil {
				return nil, err
			}
			files = append(files, m...)
			continue
		}
		files = append(files, a)
	}
	var figs []benchfig.Figure
	for _, f := range files {
		r, err := benchfig.ReadResults(f)
		if err != nil {
			return nil, err
		}
		figs = append(figs, r.Figures...)
	}
	if len(figs) == 0 {
		return nil, fmt.Errorf("no figures in %s", strings.Join(args, " "))
	}
	slices.SortFunc(figs, func(a, b benchfig.Figure) int { return strings.Compare(a.Name, b.Name) })
	return figs, nil
}

func writeTable(w io.Writer, figs []benchfig.Figure) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tMEDIAN\tSPREAD (MIN–MAX, N)\tTARGET\tHOLDS\tWHAT")
	missed := 0
	for _, f := range figs {
		target, holds := "as measured", "-"
		if f.Target != nil {
			target = f.Target.String() + " " + f.Unit
			holds = "yes"
			if !*f.Holds {
				holds = "NO"
				missed++
			}
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s–%s, %d\t%s\t%s\t%s\n", f.Name, benchfig.Format(f.Median), f.Unit,
			benchfig.Format(f.Min), benchfig.Format(f.Max), len(f.Samples), target, holds, f.About)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d figures, %d with a target, %d missed\n", len(figs),
		len(figs)-countNoTarget(figs), missed)
	return err
}

func countNoTarget(figs []benchfig.Figure) int {
	n := 0
	for _, f := range figs {
		if f.Target == nil {
			n++
		}
	}
	return n
}

// writeBenchfmt writes one benchmark line a sample: the figure's area as the benchmark name, its metric
// unit as the unit, so that benchstat groups the samples of one figure.
func writeBenchfmt(w io.Writer, figs []benchfig.Figure) error {
	for _, f := range figs {
		area, _, _ := strings.Cut(f.Name, "/")
		for _, s := range f.Samples {
			if _, err := fmt.Fprintf(w, "Benchmark%s 1 %g %s\n", strings.ToUpper(area[:1])+area[1:], s, benchfig.MetricUnit(f)); err != nil {
				return err
			}
		}
	}
	return nil
}
