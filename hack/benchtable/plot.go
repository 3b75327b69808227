package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"crust.dev/crust/internal/testutil/benchfig"
)

// Plot geometry, in SVG user units.
const (
	plotLabelWidth = 360
	plotBarWidth   = 420
	plotRowHeight  = 22
	plotMargin     = 30
)

// writePlot draws the ratio figures (unit "x") whose names start with prefix as an SVG chart of
// horizontal bars on a log scale: each bar is the median, a whisker the spread, a dashed line 1 (crust's
// path as fast as the other) and a mark the target where there is one.
func writePlot(w io.Writer, figs []benchfig.Figure, prefix string) error {
	var rows []benchfig.Figure
	for _, f := range figs {
		if strings.HasPrefix(f.Name, prefix) && f.Unit == "x" {
			rows = append(rows, f)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("no ratio figure starts with %q", prefix)
	}
	lo, hi := 1.0, 1.0
	for _, f := range rows {
		lo, hi = math.Min(lo, f.Min), math.Max(hi, f.Max)
		if f.Target != nil {
			hi = math.Max(hi, f.Target.Value)
		}
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	x := func(v float64) float64 {
		return plotLabelWidth + plotBarWidth*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	width, height := plotLabelWidth+plotBarWidth+plotMargin, plotMargin*2+plotRowHeight*len(rows)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="4" y="16">%s: median (bar), spread (whisker), target (red); log scale, 1 = as fast</text>`+"\n", html.EscapeString(prefix))
	for decade := lo; decade <= hi*1.0001; decade *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ccc"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(decade), plotMargin, x(decade), height-plotMargin+4, x(decade), height-8, benchfig.Format(decade))
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000" stroke-dasharray="4 3"/>`+"\n",
		x(1), plotMargin, x(1), height-plotMargin)
	for i, f := range rows {
		y := plotMargin + i*plotRowHeight
		mid := float64(y) + plotRowHeight/2
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n",
			plotLabelWidth-6, mid, html.EscapeString(strings.TrimPrefix(f.Name, prefix)))
		from, to := math.Min(x(1), x(f.Median)), math.Max(x(1), x(f.Median))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#4a7ab5"/>`+"\n", from, y+4, to-from, plotRowHeight-8)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`+"\n", x(f.Min), mid, x(f.Max), mid)
		if f.Target != nil {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c00" stroke-width="2"/>`+"\n",
				x(f.Target.Value), y+2, x(f.Target.Value), y+plotRowHeight-2)
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
