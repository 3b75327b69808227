package ctl

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	crustv1 "crust.dev/crust/api/crust/v1"
)

var (
	prettyJSON  = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}
	compactJSON = protojson.MarshalOptions{UseProtoNames: true}
)

// print writes m in the -o format, or def when -o was not given; rows fills the table form.
func (g *globals) print(w io.Writer, def string, m proto.Message, rows func(*table)) error {
	format := g.output
	if format == "" {
		format = def
	}
	switch format {
	case "json":
		return writeDoc(w, "json", m, "")
	case "yaml":
		return writeDoc(w, "yaml", m, "")
	case "table", "wide":
		t := &table{w: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0), wide: format == "wide"}
		rows(t)
		return t.w.Flush()
	}
	return usageError(fmt.Errorf("-o: %q is not table, wide, json or yaml", format))
}

// table is the table form; wide adds the columns that make rows long (a volume's mode and Kata caveats).
type table struct {
	w    *tabwriter.Writer
	wide bool
	// nodes makes node the first column of every row, under the header NODE, and writes the header once
	// however many nodes' answers the table shows (kubectl crust, PrintNodes).
	nodes  bool
	node   string
	headed bool
}

func (t *table) header(cols ...string) {
	if t.nodes {
		if t.headed {
			return
		}
		t.headed = true
		cols = append([]string{"NODE"}, cols...)
	}
	t.write(cols)
}

func (t *table) row(cols ...string) {
	if t.nodes && len(cols) > 0 {
		cols = append([]string{t.node}, cols...)
	}
	t.write(cols)
}

func (t *table) write(cols []string) { fmt.Fprintln(t.w, strings.Join(cols, "\t")) }

// volumeRow is volumeRows of the one volume v.
func volumeRow(t *table, v *crustv1.Volume) { volumeRows(t, v) }

// volumeRows lists volumes. FSTYPE is "-" for a raw block volume. The wide form adds VOLUME_MODE
// (filesystem or block) and KATA_CAVEATS, the number of things an unmodified Kata runtime cannot honour
// of the descriptor (`crustctl get` says what they are).
func volumeRows(t *table, vols ...*crustv1.Volume) {
	cols := []string{"TARGET", "DEVICE", "TYPE", "FSTYPE", "MODE", "SANDBOX", "AGE"}
	if t.wide {
		cols = append(cols, "VOLUME MODE", "KATA CAVEATS")
	}
	t.header(cols...)
	for _, v := range vols {
		s := v.GetSpec()
		mode := "rw"
		if s.GetReadOnly() {
			mode = "ro"
		}
		sandbox := "-"
		if c := v.GetClaim(); c != nil {
			sandbox = c.GetSandboxId()
			switch {
			case c.GetCriDiscovered():
				sandbox += " (kata, found through CRI)"
			case c.GetKata():
				sandbox += " (kata)"
			}
		}
		typ := strings.ToLower(strings.TrimPrefix(s.GetVolumeType().String(), "VOLUME_TYPE_"))
		fsType := s.GetFsType()
		if fsType == "" {
			fsType = "-"
		}
		row := []string{s.GetVolumeTargetPath(), s.GetVolumeBackingPath(), typ, fsType, mode, sandbox, age(v.GetStageTime().AsTime())}
		if t.wide {
			volMode := "filesystem"
			if s.GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
				volMode = "block"
			}
			caveats := "-"
			if c := v.GetKataCaveats(); len(c) > 0 {
				caveats = strings.Join(c, "; ")
			}
			row = append(row, volMode, caveats)
		}
		t.row(row...)
	}
}

func statsRows(t *table, r *crustv1.GetVolumeStatsResponse) {
	t.header("UNIT", "TOTAL", "USED", "AVAILABLE")
	for _, u := range r.GetUsage() {
		unit := strings.ToLower(strings.TrimPrefix(u.GetUnit().String(), "UNIT_"))
		t.row(unit, strconv.FormatInt(u.GetTotal(), 10), strconv.FormatInt(u.GetUsed(), 10), strconv.FormatInt(u.GetAvailable(), 10))
	}
	switch c := r.GetVolumeCondition(); {
	case c.GetAbnormal():
		t.row("condition", "abnormal", c.GetMessage(), "")
	case c.GetMessage() != "": // such as a volume no sandbox has mounted yet
		t.row("condition", "normal", c.GetMessage(), "")
	}
}

func age(t time.Time) string {
	if t.IsZero() || t.Unix() == 0 {
		return "-"
	}
	return time.Since(t).Round(time.Second).String()
}

// writeDoc writes m as one document after sep: "json" (indented), "jsonl" (one line) or "yaml".
func writeDoc(w io.Writer, form string, m proto.Message, sep string) error {
	opts := compactJSON
	if form == "json" {
		opts = prettyJSON
	}
	b, err := opts.Marshal(m)
	if err != nil {
		return err
	}
	if form != "yaml" {
		_, err = fmt.Fprintf(w, "%s%s\n", sep, b)
		return err
	}
	if b, err = yaml.JSONToYAML(b); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s", sep, b)
	return err
}

// outputs are the -o formats.
var outputs = map[string]bool{"": true, "table": true, "wide": true, "json": true, "yaml": true}

// checkOutput refuses an -o that print would refuse, before a command starts a stream.
func (g *globals) checkOutput() error { return CheckOutput(g.output) }

// CheckOutput refuses, as a usage error, an -o format that crustctl (and PrintNodes) cannot print; ""
// is the default form, the table.
func CheckOutput(format string) error {
	if !outputs[format] {
		return usageError(fmt.Errorf("-o: %q is not table, wide, json or yaml", format))
	}
	return nil
}

// printEvent writes one watch event in the -o format: a JSON document a line (the default, and json,
// so that a stream stays one document a line), a YAML document, or a table row, the header before the
// first (*header records that it was written). Each event is written, and flushed, as it arrives.
func (g *globals) printEvent(w io.Writer, ev *crustv1.WatchVolumesResponse, header *bool) error {
	switch g.output {
	case "", "json":
		return writeDoc(w, "jsonl", ev, "")
	case "yaml":
		return writeDoc(w, "yaml", ev, "---\n")
	}
	// Rows are flushed one at a time, so the columns are padded to a fixed minimum instead of aligned.
	t := &table{w: tabwriter.NewWriter(w, 12, 4, 2, ' ', 0), wide: g.output == "wide"}
	cols := []string{"REVISION", "EVENT", "TARGET", "SANDBOX", "DETAIL"}
	if t.wide {
		cols = append(cols, "DEVICE", "RELEASED BY")
	}
	if !*header {
		t.header(cols...)
		*header = true
	}
	v := ev.GetVolume()
	sandbox := "-"
	if c := v.GetClaim(); c != nil {
		sandbox = c.GetSandboxId()
	} else if c := ev.GetReleasedClaim(); c != nil {
		sandbox = c.GetSandboxId()
	}
	target := v.GetSpec().GetVolumeTargetPath()
	if target == "" {
		target = "-"
	}
	detail := ev.GetDetail()
	if ev.GetResumed() {
		detail = "resumed"
	}
	if detail == "" {
		detail = "-"
	}
	row := []string{strconv.FormatUint(ev.GetRevision(), 10), enumWord(ev.GetType().String(), "EVENT_TYPE_"), target, sandbox, detail}
	if t.wide {
		dev := v.GetSpec().GetVolumeBackingPath()
		if dev == "" {
			dev = "-"
		}
		by := "-"
		if ev.GetReleaseReason() != 0 {
			by = enumWord(ev.GetReleaseReason().String(), "RELEASE_REASON_")
		}
		row = append(row, dev, by)
	}
	t.row(row...)
	return t.w.Flush()
}

// infoRows is GetInfo's answer as a table: one row, its lists comma-separated (one feature a line in the
// wide form's FEATURES column would break the table; -o yaml lists them one a line).
func infoRows(t *table, r *crustv1.GetInfoResponse) {
	t.header("VERSION", "REVISION", "API", "FEATURES")
	features := strings.Join(r.GetFeatures(), ",")
	if features == "" {
		features = "-"
	}
	t.row(r.GetVersion(), r.GetRevision(), strings.Join(r.GetApiVersions(), ","), features)
}

// enumWord is a protobuf enum value's name without its prefix, in lower case: EVENT_TYPE_STAGED → staged.
func enumWord(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
