package ctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// errProblemsFound makes doctor exit 3 after printing what it found.
var errProblemsFound = errors.New("problems found")

func (g *globals) doctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "List what crustd set aside instead of failing for, and what to do about each (exit 3 when there is any)",
		Long: `doctor asks crustd for every problem it knows of: volumes whose Kata projection could not be
written (they are still served to crust's own handlers), files in Kata volume directories that no Kata
shim writes, and damaged store records moved aside at start. Each comes with the target path, what is
wrong and what an operator can do. It changes nothing. Exit status: 0 when there is no problem, 3 when
there are problems, 1 when crustd could not be asked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				r, err := crustv1.NewVolumeServiceClient(conn).ListProblems(ctx, &crustv1.ListProblemsRequest{})
				if err != nil {
					return err
				}
				if err := g.print(cmd.OutOrStdout(), "table", r, func(t *table) { problemRows(t, r) }); err != nil {
					return err
				}
				if len(r.GetProblems()) > 0 || r.GetOmitted() > 0 {
					return errProblemsFound
				}
				return nil
			})
		},
	}
}

// problemRows prints one block per problem, blocks separated by an empty line.
func problemRows(t *table, r *crustv1.ListProblemsResponse) {
	if len(r.GetProblems()) == 0 {
		t.row("no problems found")
		return
	}
	for i, p := range r.GetProblems() {
		if i > 0 {
			t.row()
		}
		t.row("PROBLEM", strings.ToLower(strings.TrimPrefix(p.GetKind().String(), "PROBLEM_KIND_")))
		t.row("TARGET", cmp.Or(p.GetVolumeTargetPath(), "-"))
		t.row("PATH", cmp.Or(p.GetPath(), "-"))
		t.row("WHAT", p.GetMessage())
		t.row("TO DO", p.GetRemedy())
	}
	if n := r.GetOmitted(); n > 0 {
		t.row()
		t.row(fmt.Sprintf("%d more problems not shown; fix these and run doctor again", n))
	}
}
