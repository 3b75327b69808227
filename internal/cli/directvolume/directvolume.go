// Package directvolume is `crustctl direct-volume`, an offline drop-in for `kata-runtime direct-volume`
// for drivers written as shell scripts. add and remove work on the same files, with the same meaning, as
// Kata's commands (see crust.dev/crust/api/kata), in the directory given by --kata-dir; get and list,
// which Kata lacks, print what Kata reads back. stats and resize, like Kata's, ask the Kata shim of the
// sandbox that uses the volume (the first sandbox id in its directory) about the volume's device (the
// device of its mountInfo.json), over the shim's management socket. Nothing here talks to crustd.
//
// Errors are returned to the caller, never printed here; a message about bad input starts with the flag
// it is about, such as "--mount-info: invalid mount info: ...".
package directvolume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"crust.dev/crust/api/volume"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/safedir"
)

// options are the flags the subcommands share.
type options struct {
	kataDir    string
	volumePath string
	mountInfo  string
	output     string
	shimDirs   []string
	timeout    time.Duration
	size       uint64
}

// NewCommand returns the direct-volume command with its subcommands add, remove, get, list, stats and
// resize.
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
	cmd.AddCommand(o.addCmd(), o.removeCmd(), o.getCmd(), o.listCmd(), o.statsCmd(), o.resizeCmd())
	return cmd
}

func (o *options) addCmd() *cobra.Command {
	return subcommand("add --volume-path PATH --mount-info JSON",
		"Record a volume's mount info for Kata (keeps the sandbox ids already recorded)",
		func(*cobra.Command) error {
			if err := o.check(); err != nil {
				return err
			}
			if o.mountInfo == "" {
				return errors.New("--mount-info: required")
			}
			return flagError(kata.Add(o.kataDir, o.volumePath, o.mountInfo))
		}, o.volumePathFlag, func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&o.mountInfo, "mount-info", "", `the mount info as JSON, such as {"volume-type":"directvol","device":"/dev/sdb","fstype":"ext4"}`)
		})
}

func (o *options) removeCmd() *cobra.Command {
	return subcommand("remove --volume-path PATH",
		"Delete a volume's directory with its sandbox ids (a missing volume is not an error)",
		func(*cobra.Command) error {
			if err := o.check(); err != nil {
				return err
			}
			return flagError(kata.Remove(o.kataDir, o.volumePath))
		}, o.volumePathFlag)
}

func (o *options) getCmd() *cobra.Command {
	return subcommand("get --volume-path PATH", "Print a volume's mount info and sandbox ids as Kata reads them",
		func(cmd *cobra.Command) error {
			vol, err := o.volume()
			if err != nil {
				return err
			}
			v := newView(vol)
			return o.print(cmd.OutOrStdout(), "json", v, []view{v})
		}, o.volumePathFlag, o.outputFlag)
}

func (o *options) listCmd() *cobra.Command {
	return subcommand("list", "Print every volume in the Kata directory, ordered by volume path",
		func(cmd *cobra.Command) error {
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
		}, o.outputFlag)
}

func (o *options) statsCmd() *cobra.Command {
	return subcommand("stats --volume-path PATH",
		"Print a volume's usage inside the Kata sandbox that uses it, as the shim's JSON",
		func(cmd *cobra.Command) error {
			return o.askShim(cmd, func(ctx context.Context, c *kata.ShimClient, sandbox, device string) error {
				st, err := c.Stats(ctx, sandbox, device)
				if err != nil {
					return err
				}
				b, err := json.Marshal(st)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			})
		}, o.volumePathFlag, o.shimFlags)
}

func (o *options) resizeCmd() *cobra.Command {
	return subcommand("resize --volume-path PATH --size BYTES",
		"Ask the Kata sandbox that uses a volume to grow it to --size bytes",
		func(cmd *cobra.Command) error {
			if !cmd.Flags().Changed("size") {
				return errors.New("--size: required")
			}
			if o.size == 0 {
				return errors.New("--size: must be positive")
			}
			return o.askShim(cmd, func(ctx context.Context, c *kata.ShimClient, sandbox, device string) error {
				return c.Resize(ctx, sandbox, device, o.size)
			})
		}, o.volumePathFlag, o.shimFlags, func(cmd *cobra.Command) {
			cmd.Flags().Uint64Var(&o.size, "size", 0, "the size wanted, in bytes (required)")
		})
}

// subcommand returns a subcommand that takes no arguments and runs run, with the flags that each of
// flags adds.
func subcommand(use, short string, run func(*cobra.Command) error, flags ...func(*cobra.Command)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return run(cmd) },
	}
	for _, add := range flags {
		add(cmd)
	}
	return cmd
}

// volume returns the volume at --volume-path in --kata-dir: its mount info and sandbox ids, as Kata reads
// them.
func (o *options) volume() (kata.Volume, error) {
	if err := o.check(); err != nil {
		return kata.Volume{}, err
	}
	info, err := kata.Get(o.kataDir, o.volumePath)
	if err != nil {
		return kata.Volume{}, flagError(err)
	}
	ids, err := kata.SandboxIDs(o.kataDir, o.volumePath)
	if err != nil {
		return kata.Volume{}, flagError(err)
	}
	return kata.Volume{Path: o.volumePath, MountInfo: *info, SandboxIDs: ids}, nil
}

// askShim runs ask, within --timeout, with a client of the shims in --kata-shim-dirs and what stats and
// resize send to a shim: the sandbox that uses the volume, the first of its sandbox ids as Kata takes it,
// and the device of its mount info.
func (o *options) askShim(cmd *cobra.Command, ask func(ctx context.Context, c *kata.ShimClient, sandbox, device string) error) error {
	vol, err := o.volume()
	if err != nil {
		return err
	}
	if len(vol.SandboxIDs) == 0 {
		return fmt.Errorf("--volume-path: direct volume %q is used by no sandbox (no sandbox id is recorded)", o.volumePath)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	return ask(ctx, &kata.ShimClient{Dirs: o.shimDirs}, vol.SandboxIDs[0], vol.MountInfo.Device)
}

// shimFlags are where stats and resize look for the shim, and how long they wait. --timeout shadows
// crustctl's global flag of the same name and meaning.
func (o *options) shimFlags(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&o.shimDirs, "kata-shim-dirs", kata.DefaultShimDirs(),
		"directories of Kata sandboxes, tried in order for <dir>/<sandbox id>/shim-monitor.sock")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for the shim")
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

// flagError prefixes an error from api/kata with the flag it is about.
func flagError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kata.ErrInvalidMountInfo):
		return fmt.Errorf("--mount-info: %w", err)
	case errors.Is(err, kata.ErrInvalidVolumePath), errors.Is(err, kata.ErrNotFound):
		return fmt.Errorf("--volume-path: %w", err)
	case errors.Is(err, kata.ErrForeignEntry), errors.Is(err, safedir.ErrInsecure):
		return fmt.Errorf("--kata-dir: %w", err)
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
	info := v.MountInfo
	info.Metadata = volume.Redact(info.Metadata) // secret values (encryptionKey) are never printed
	return view{VolumePath: v.Path, MountInfo: info, SandboxIDs: ids}
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
