// Command promrules writes the rule groups of a PrometheusRule manifest as a Prometheus rules file, so
// that `promtool test rules` tests the very rules the manifest ships:
//
//	go run ./hack/promrules deploy/monitoring/prometheusrule.yaml OUT/rules.yaml
//
// It fails on a manifest that is not a PrometheusRule or has no rule groups.
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "promrules:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: promrules PROMETHEUSRULE.yaml OUT.yaml")
	}
	in, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var m struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(in, &m); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	if m.Kind != "PrometheusRule" || len(m.Spec.Groups) == 0 {
		return fmt.Errorf("%s: not a PrometheusRule with rule groups (kind %q)", args[0], m.Kind)
	}
	out, err := yaml.Marshal(map[string]any{"groups": m.Spec.Groups})
	if err != nil {
		return err
	}
	return os.WriteFile(args[1], out, 0o644)
}
