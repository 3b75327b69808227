// Package ctl is crustctl: the operator's and scripts' command line for crustd, plus `direct-volume`, an
// offline drop-in for `kata-runtime direct-volume`.
//
// Promises: data goes to stdout in the format chosen with -o (table, wide, json or yaml; wide is the
// table with more columns, such as a volume's mode and Kata caveats; json and yaml are the API's protobuf
// JSON mapping, stable field names); errors go to stderr as "crustctl: CODE: message" with
// the gRPC code, and the exit status is 1 (2 for a usage error). `doctor` exits 3 when it found problems.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/cli/directvolume"
	"crust.dev/crust/pkg/command"
)

// usageError marks a mistake in the command line.
func usageError(err error) error { return command.UsageError{Err: err} }

// Main runs crustctl with args and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	// Every string crustctl sends is a protobuf string, which must be UTF-8: name the argument that is
	// not, rather than let the encoder fail with an INTERNAL that names none.
	for i, a := range args {
		if utf8.ValidString(a) {
			continue
		}
		what := fmt.Sprintf("argument %d", i+1)
		if name, _, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "-") && utf8.ValidString(name) {
			what = name
		} else if i > 0 && strings.HasPrefix(args[i-1], "-") {
			what = "the value of " + args[i-1]
		}
		fmt.Fprintf(stderr, "crustctl: %s is not valid UTF-8\n", what)
		return 2
	}
	err := command.Execute(NewCommand(), args, stdout, stderr)
	if err == nil {
		return 0
	}
	if errors.Is(err, errProblemsFound) {
		return 3
	}
	if s, ok := errdefs.Status(err); ok && !command.IsUsage(err) {
		fmt.Fprintf(stderr, "crustctl: %s: %s\n", s.Code(), s.Message())
		return 1
	}
	fmt.Fprintf(stderr, "crustctl: %v\n", err)
	if command.IsUsage(err) {
		return 2
	}
	return 1
}

type globals struct {
	socket  string
	output  string
	timeout time.Duration
}

// NewCommand returns the crustctl command tree.
func NewCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "crustctl",
		Short:         "Inspect and drive crustd, the crust node daemon",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	command.AddSocketFlag(pf, &g.socket, crustd.DefaultSocket, "crustd's socket", "socket")
	pf.StringVarP(&g.output, "output", "o", "", "output format: table, wide (a table with more columns, such as a volume's mode and Kata caveats), json or yaml")
	pf.DurationVar(&g.timeout, "timeout", 30*time.Second, "how long a call may take")
	root.AddCommand(
		g.lsCmd(), g.getCmd(), g.stageCmd(), g.unstageCmd(), g.statsCmd(), g.expandCmd(),
		g.claimCmd(), g.releaseCmd(), g.watchCmd(), g.doctorCmd(), g.infoCmd(), directvolume.NewCommand(),
		command.VersionCommand(g.crustdVersion),
	)
	command.SetVersion(root)
	return root
}

// versionTimeout bounds the call `crustctl version` makes, so that it answers soon with crustctl's own
// version even when crustd hangs.
const versionTimeout = 5 * time.Second

// crustdVersion is what `crustctl version` prints after its own version: crustd's, as GetInfo answers
// it, or why it could not be asked. It never fails: crustctl's version is printed whatever crustd does.
func (g *globals) crustdVersion(cmd *cobra.Command, w io.Writer) error {
	err := g.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(ctx, versionTimeout)
		defer cancel()
		r, err := crustv1.NewInfoServiceClient(conn).GetInfo(ctx, &crustv1.GetInfoRequest{})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "crustd version %s (revision %s, API %s)\n", r.GetVersion(), r.GetRevision(),
			strings.Join(r.GetApiVersions(), ", "))
		return err
	})
	if errors.Is(err, errdefs.ErrUnimplemented) {
		_, err = fmt.Fprintln(w, "crustd: older than its API's GetInfo; its version is in its metrics (crust_build_info)")
	} else if err != nil {
		_, err = fmt.Fprintf(w, "crustd: not asked (%v); its version is also in its metrics (crust_build_info)\n", err)
	}
	return err
}

func (g *globals) infoCmd() *cobra.Command {
	return &cobra.Command{
		Use: "info", Short: "Show what crustd speaks: its version, the API versions and the features it serves", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, "table", func(ctx context.Context, conn *grpc.ClientConn) (*crustv1.GetInfoResponse, error) {
				return crustv1.NewInfoServiceClient(conn).GetInfo(ctx, &crustv1.GetInfoRequest{})
			}, infoRows)
		},
	}
}

// call dials crustd and runs fn with a context bounded by --timeout.
func (g *globals) call(cmd *cobra.Command, fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	conn, err := crustd.Dial(g.socket)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	return fn(ctx, conn)
}

// show runs call on crustd and prints what it answers in the -o format (def when -o is not given), as
// rows for a table.
func show[R proto.Message](g *globals, cmd *cobra.Command, def string, call func(ctx context.Context, conn *grpc.ClientConn) (R, error),
	rows func(t *table, r R)) error {
	return g.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
		r, err := call(ctx, conn)
		if err != nil {
			return err
		}
		return g.print(cmd.OutOrStdout(), def, r, func(t *table) { rows(t, r) })
	})
}

func (g *globals) lsCmd() *cobra.Command {
	return &cobra.Command{
		Use: "ls", Short: "List staged volumes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				// Every page, printed as one list (next_token empty).
				r := &crustv1.ListVolumesResponse{}
				for token := ""; ; {
					page, err := crustv1.NewVolumeServiceClient(conn).ListVolumes(ctx, &crustv1.ListVolumesRequest{StartingToken: token})
					if err != nil {
						return err
					}
					r.Volumes = append(r.Volumes, page.GetVolumes()...)
					if token = page.GetNextToken(); token == "" {
						break
					}
				}
				return g.print(cmd.OutOrStdout(), "table", r, func(t *table) { volumeRows(t, r.GetVolumes()...) })
			})
		},
	}
}

func (g *globals) getCmd() *cobra.Command {
	return &cobra.Command{
		Use: "get TARGET", Short: "Show one volume", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(g, cmd, "json", func(ctx context.Context, conn *grpc.ClientConn) (*crustv1.Volume, error) {
				r, err := crustv1.NewVolumeServiceClient(conn).GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: args[0]})
				return r.GetVolume(), err
			}, volumeRow)
		},
	}
}

func (g *globals) stageCmd() *cobra.Command {
	spec := &crustv1.VolumeSpec{}
	var (
		volType, volMode, policy string
		fsGroup                  int64
		metadata                 map[string]string
	)
	cmd := &cobra.Command{
		Use: "stage", Short: "Deposit a volume's descriptor (what a CSI plugin does in NodePublishVolume)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, ok := crustv1.VolumeType_value["VOLUME_TYPE_"+strings.ToUpper(volType)]
			if !ok {
				return usageError(fmt.Errorf("--volume-type: %q is not block, file or pmem", volType))
			}
			spec.VolumeType = crustv1.VolumeType(t)
			if cmd.Flags().Changed("volume-mode") {
				m, ok := crustv1.VolumeMode_value["VOLUME_MODE_"+strings.ToUpper(volMode)]
				if !ok || m == 0 {
					return usageError(fmt.Errorf("--volume-mode: %q is not filesystem or block", volMode))
				}
				spec.VolumeMode = crustv1.VolumeMode(m)
			}
			if cmd.Flags().Changed("fs-group") {
				spec.VolumeSupplementalGroup = &fsGroup
			}
			if policy != "" {
				p, ok := crustv1.FSGroupChangePolicy_value["FS_GROUP_CHANGE_POLICY_"+strings.ToUpper(policy)]
				if !ok {
					return usageError(fmt.Errorf("--fs-group-policy: %q is not always or on_root_mismatch", policy))
				}
				spec.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy(p)
			}
			spec.Metadata = metadata
			return show(g, cmd, "json", func(ctx context.Context, conn *grpc.ClientConn) (*crustv1.Volume, error) {
				r, err := crustv1.NewVolumeServiceClient(conn).StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: spec})
				return r.GetVolume(), err
			}, volumeRow)
		},
	}
	f := cmd.Flags()
	f.StringVar(&spec.VolumeTargetPath, "target-path", "", "the volume's publish target path (required)")
	f.StringVar(&spec.VolumeBackingPath, "device", "", "the block device or image file (required)")
	f.StringVar(&spec.FsType, "fs-type", "", "ext4, ext3, xfs or btrfs (required in the filesystem mode, refused in the block mode)")
	f.StringVar(&volType, "volume-type", "block", "block, file or pmem")
	f.StringVar(&volMode, "volume-mode", "filesystem", "filesystem, or block for a raw device in the sandbox (no filesystem)")
	f.StringArrayVar(&spec.MountFlags, "mount-option", nil, "mount option, one per flag (repeatable)")
	f.Int64Var(&fsGroup, "fs-group", 0, "the pod's fsGroup")
	f.StringVar(&policy, "fs-group-policy", "", "always or on_root_mismatch")
	f.BoolVar(&spec.ReadOnly, "read-only", false, "mount read-only")
	f.BoolVar(&spec.CreateFilesystem, "create-filesystem", false, "format the device in the sandbox when it holds no filesystem")
	f.StringVar(&spec.VolumeId, "volume-id", "", "the CSI volume id")
	f.StringVar(&spec.CsiDriver, "csi-driver", "", "the CSI driver name")
	f.StringVar(&spec.PodUid, "pod-uid", "", "the pod UID")
	f.StringToStringVar(&metadata, "metadata", nil, "key=value for the runtime handler (repeatable)")
	for _, name := range []string{"target-path", "device"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func (g *globals) unstageCmd() *cobra.Command {
	var target string
	cmd := &cobra.Command{
		Use: "unstage", Short: "Remove a volume's descriptor (an unknown target is not an error)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				r, err := crustv1.NewVolumeServiceClient(conn).UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target})
				if c := r.GetKeptClaim(); c != nil {
					_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "unstaged; the claim of sandbox %q is kept: the device stays reserved for it "+
						"until it is released (crustctl release)\n", c.GetSandboxId())
				}
				return err
			})
		},
	}
	cmd.Flags().StringVar(&target, "target-path", "", "the volume's publish target path (required)")
	_ = cmd.MarkFlagRequired("target-path")
	return cmd
}

func (g *globals) statsCmd() *cobra.Command {
	return &cobra.Command{
		Use: "stats TARGET", Short: "Show a volume's usage, measured inside the sandbox that claimed it (before any claim: the device's size)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(g, cmd, "table", func(ctx context.Context, conn *grpc.ClientConn) (*crustv1.GetVolumeStatsResponse, error) {
				return crustv1.NewVolumeServiceClient(conn).GetVolumeStats(ctx, &crustv1.GetVolumeStatsRequest{VolumeTargetPath: args[0]})
			}, statsRows)
		},
	}
}

func (g *globals) expandCmd() *cobra.Command {
	var size string
	cmd := &cobra.Command{
		Use: "expand TARGET --size BYTES", Short: "Grow a volume: online in the sandbox that claimed it, or at its next mount when none has", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := ParseBytes(size)
			if err != nil {
				return usageError(fmt.Errorf("--size: %w", err))
			}
			return show(g, cmd, "table", func(ctx context.Context, conn *grpc.ClientConn) (*crustv1.ExpandVolumeResponse, error) {
				return crustv1.NewVolumeServiceClient(conn).ExpandVolume(ctx, &crustv1.ExpandVolumeRequest{VolumeTargetPath: args[0], RequiredBytes: n})
			}, func(t *table, r *crustv1.ExpandVolumeResponse) {
				t.header("CAPACITY_BYTES")
				t.row(strconv.FormatInt(r.GetCapacityBytes(), 10))
			})
		},
	}
	cmd.Flags().StringVar(&size, "size", "", "capacity wanted: bytes, or with a K, M, G or T suffix (powers of 1024) (required)")
	_ = cmd.MarkFlagRequired("size")
	return cmd
}

func (g *globals) claimCmd() *cobra.Command {
	var sandbox, endpoint string
	cmd := &cobra.Command{
		Use: "claim TARGET --sandbox-id ID", Short: "Claim a volume for a sandbox, as a runtime handler does (for testing and recovery)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(g, cmd, "json", func(ctx context.Context, conn *grpc.ClientConn) (*crustv1.Volume, error) {
				r, err := crustv1.NewRuntimeServiceClient(conn).ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{
					VolumeTargetPath: args[0], SandboxId: sandbox, HandlerEndpoint: endpoint,
				})
				// The claim's answer carries secret metadata whole, for a handler; printed, it is redacted.
				return volume.RedactVolume(r.GetVolume()), err
			}, volumeRow)
		},
	}
	cmd.Flags().StringVar(&sandbox, "sandbox-id", "", "the claiming sandbox (required)")
	cmd.Flags().StringVar(&endpoint, "endpoint", "", "the handler's RuntimeHandlerService address, unix:///path")
	_ = cmd.MarkFlagRequired("sandbox-id")
	return cmd
}

func (g *globals) releaseCmd() *cobra.Command {
	var sandbox string
	var force bool
	cmd := &cobra.Command{
		Use: "release TARGET (--sandbox-id ID | --force)", Short: "End a sandbox's claim on a volume (--force: whoever holds it)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sandbox == "" && !force {
				return usageError(errors.New("--sandbox-id or --force is required"))
			}
			return g.call(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				_, err := crustv1.NewRuntimeServiceClient(conn).ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{
					VolumeTargetPath: args[0], SandboxId: sandbox, Force: force,
				})
				return err
			})
		},
	}
	cmd.Flags().StringVar(&sandbox, "sandbox-id", "", "the sandbox whose claim ends")
	cmd.Flags().BoolVar(&force, "force", false, "end the claim whoever holds it (for a dead handler)")
	return cmd
}

func (g *globals) watchCmd() *cobra.Command {
	var (
		existing bool
		since    uint64
	)
	cmd := &cobra.Command{
		Use: "watch", Short: "Print volume events as they happen: one JSON document a line (the default), a table row each (-o table), or YAML documents", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			header := false
			conn, err := crustd.Dial(g.socket)
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			req := &crustv1.WatchVolumesRequest{SendExisting: existing}
			if cmd.Flags().Changed("since") {
				req.SinceRevision = &since
			}
			stream, err := crustv1.NewRuntimeServiceClient(conn).WatchVolumes(cmd.Context(), req)
			if err != nil {
				return err
			}
			for {
				ev, err := stream.Recv()
				if err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if err := g.printEvent(cmd.OutOrStdout(), ev, &header); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().BoolVar(&existing, "existing", false, "first list the volumes that exist (with --since: only when crustd cannot resume)")
	cmd.Flags().Uint64Var(&since, "since", 0, "resume after this revision: first the changes made since, then a synced event "+
		"(DETAIL resumed); OUT_OF_RANGE when crustd no longer keeps them")
	return cmd
}

// ParseBytes reads a size: plain bytes, or a number with a K, M, G or T suffix (optionally followed by
// "i" or "iB"), meaning powers of 1024.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(s), "B"), "i")
	shift := 0
	if t != "" {
		switch t[len(t)-1] {
		case 'K', 'k':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)>>shift {
		return 0, fmt.Errorf("%q is not a positive size such as 1073741824 or 1G", s)
	}
	return n << shift, nil
}
