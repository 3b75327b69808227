package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// NodeAnswer is what the crustd of one node answered to a crustctl command, as kubectl crust gathers
// them: a *ListVolumesResponse (ls), a *Volume (get) or a *ListProblemsResponse (doctor).
type NodeAnswer struct {
	Node   string
	Answer proto.Message
}

// PrintNodes writes answers in an -o format of crustctl's. table (also "") and wide are crustctl's table
// forms in one table whose first column is NODE; json and yaml are one document, {"items": [...]}, an
// item per answer: the answer's fields as crustctl prints them, and "node". An answer of a type crustctl
// does not print is an error, and so is an unknown format (a usage error).
func PrintNodes(w io.Writer, format string, answers []NodeAnswer) error {
	switch format {
	case "", "table", "wide":
		t := &table{w: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0), wide: format == "wide", nodes: true}
		for _, a := range answers {
			t.node = a.Node
			switch r := a.Answer.(type) {
			case *crustv1.ListVolumesResponse:
				volumeRows(t, r.GetVolumes()...)
			case *crustv1.Volume:
				volumeRow(t, r)
			case *crustv1.ListProblemsResponse:
				problemRows(t, r)
			default:
				return fmt.Errorf("no table form for %T", a.Answer)
			}
		}
		return t.w.Flush()
	case "json", "yaml":
		items := make([]map[string]json.RawMessage, 0, len(answers))
		for _, a := range answers {
			b, err := compactJSON.Marshal(a.Answer)
			if err != nil {
				return err
			}
			item := map[string]json.RawMessage{}
			if err := json.Unmarshal(b, &item); err != nil {
				return err
			}
			if item["node"], err = json.Marshal(a.Node); err != nil {
				return err
			}
			items = append(items, item)
		}
		b, err := json.MarshalIndent(map[string]any{"items": items}, "", "  ")
		if err != nil {
			return err
		}
		if format == "yaml" {
			if b, err = yaml.JSONToYAML(b); err != nil {
				return err
			}
			_, err = w.Write(b)
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	return usageError(fmt.Errorf("-o: %q is not table, wide, json or yaml", format))
}
