// Package directvolume is `crustctl direct-volume`, an offline drop-in for `kata-runtime direct-volume`
// for drivers written as shell scripts. add and remove work on the same files, with the same meaning, as
// Kata's commands (see crust.dev/crust/pkg/kata), in the directory given by --kata-dir; get and list,
// which Kata lacks, print what Kata reads back. Nothing here talks to crustd.
//
// Errors are returned to the caller, never printed here; a message about bad input starts with the flag
// it is about, such as "--mount-info: invalid mount info: ...".
package directvolume

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"crust.dev/crust/pkg/kata"
)

// options are the flags the subcommands share.
type options struct {
	kataDir    string
	volumePath string
	mountInfo  string
	output     string
}

// NewCommand returns the direct-volume command with its subcommands add, remove, get and list.
func NewCommand() *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:           "direct-volume",
		Short:         "Manage Kata direct-assigned volumes offline, like kata-runtime direct-volume",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.PersistentFlags().StringVar(&o.kataDir, "kata-dir", kata.DefaultDir, "Kata direct-volume directory")
	// stats and resize join these once crust can talk to the Kata shim's management socket.
	cmd.AddCommand(o.addCmd(), o.removeCmd(), o.getCmd(), o.listCmd())
	return cmd
}

func (o *options) addCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "add --volume-path PATH --mount-info JSON",
		Short: "Record a volume's mount info for Kata (keeps the sandbox ids already recorded)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if o.mountInfo == "" {
				return errors.New("--mount-info: required")
			}
			return flagError(kata.Add(o.kataDir, o.volumePath, o.mountInfo))
		},
	}
	o.volumePathFlag(cmd)
	cmd.Flags().StringVar(&o.mountInfo, "mount-info", "", `the mount info as JSON, such as {"volume-type":"directvol","device":"/dev/sdb","fstype":"ext4"}`)
	return cmd
}

func (o *options) removeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "remove --volume-path PATH",
		Short: "Delete a volume's directory with its sandbox ids (a missing volume is not an error)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := o.check(); err != nil {
				return err
			}
			return flagError(kata.Remove(o.kataDir, o.volumePath))
		},
	}
	o.volumePathFlag(cmd)
	return cmd
}

func (o *options) getCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get --volume-path PATH",
		Short: "Print a volume's mount info and sandbox ids as Kata reads them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			info, err := kata.Get(o.kataDir, o.volumePath)
			if err != nil {
				return flagError(err)
			}
			ids, err := kata.SandboxIDs(o.kataDir, o.volumePath)
			if err != nil {
				return flagError(err)
			}
			v := newView(kata.Volume{Path: o.volumePath, MountInfo: *info, SandboxIDs: ids})
			return o.print(cmd.OutOrStdout(), "json", v, []view{v})
		},
	}
	o.volumePathFlag(cmd)
	o.outputFlag(cmd)
	return cmd
}

func (o *options) listCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Print every volume in the Kata directory, ordered by volume path",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.kataDir == "" {
				return errors.New("--kata-dir: required")
			}
			vols, err := kata.List(o.kataDir)
			if err != nil {
				return err
			}
			views := make([]view, 0, len(vols))
			for _, v := range vols {
				views = append(views, newView(v))
			}
			return o.print(cmd.OutOrStdout(), "table", views, views)
		},
	}
	o.outputFlag(cmd)
	return cmd
}

func (o *options) volumePathFlag(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.volumePath, "volume-path", "", "the target path the volume is published to")
}

// outputFlag is named like crustctl's global -o, which it shadows.
func (o *options) outputFlag(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json, yaml or table")
}

// check refuses empty --kata-dir and --volume-path.
func (o *options) check() error {
	if o.kataDir == "" {
		return errors.New("--kata-dir: required")
	}
	if o.volumePath == "" {
		return errors.New("--volume-path: required")
	}
	return nil
}

// flagError prefixes an error from pkg/kata with the flag it is about.
func flagError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kata.ErrInvalidMountInfo):
		return fmt.Errorf("--mount-info: %w", err)
	case errors.Is(err, kata.ErrInvalidVolumePath), errors.Is(err, kata.ErrNotFound):
		return fmt.Errorf("--volume-path: %w", err)
	}
	return err
}

// view is how get and list print a volume. The keys are stable, for scripts.
type view struct {
	VolumePath string         `json:"volume_path"`
	MountInfo  kata.MountInfo `json:"mount_info"`
	SandboxIDs []string       `json:"sandbox_ids"`
}

func newView(v kata.Volume) view {
	ids := v.SandboxIDs
	if ids == nil {
		ids = []string{} // [] rather than null for scripts
	}
	return view{VolumePath: v.Path, MountInfo: v.MountInfo, SandboxIDs: ids}
}

// print writes data in the -o format, or def when -o was not given; table prints rows.
func (o *options) print(w io.Writer, def string, data any, rows []view) error {
	format := o.output
	if format == "" {
		format = def
	}
	switch format {
	case "json":
		b, err := json.MarshalIndent(data, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(data)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "table":
		// Metadata is left out: it may hold an encryption key.
		var b strings.Builder
		b.WriteString("VOLUME PATH\tTYPE\tDEVICE\tFSTYPE\tOPTIONS\tSANDBOX\n")
		for _, v := range rows {
			b.WriteString(strings.Join([]string{v.VolumePath, dash(v.MountInfo.VolumeType), dash(v.MountInfo.Device),
				dash(v.MountInfo.FsType), dash(strings.Join(v.MountInfo.Options, ",")), dash(strings.Join(v.SandboxIDs, ","))}, "\t"))
			b.WriteString("\n")
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		if _, err := io.WriteString(tw, b.String()); err != nil {
			return err
		}
		return tw.Flush()
	}
	return fmt.Errorf("--output: %q is not json, yaml or table", format)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
