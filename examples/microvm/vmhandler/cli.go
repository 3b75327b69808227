package vmhandler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/pkg/command"
)

// Exit statuses of Main besides the guest command's own (exec).
const (
	// ExitUsage is a mistake in the command line.
	ExitUsage = 2
	// ExitVMDied: run ended because QEMU exited under it; the claims were released, the VM not restarted.
	ExitVMDied = 3
	// ExitExecFailed: exec could not run the command (sandbox not running, VM not up, agent error).
	ExitExecFailed = 125
	// ExitExecNotFound: the command does not exist in the guest.
	ExitExecNotFound = 127
)

// usageError marks a mistake in the command line.
func usageError(err error) error { return command.UsageError{Err: err} }

// exitError carries a status of its own (exec's).
type exitError struct {
	code int
	err  error // nil: print nothing
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

// Main runs crust-microvm with args and returns its exit status:
//
//	crust-microvm run --name NAME --crust-socket PATH --volume TARGET:GUEST_PATH... [--accel tcg|kvm|auto]
//	                  [--sandbox-id ID] [--state-dir DIR] [--assets DIR]
//	crust-microvm exec [--state-dir DIR] NAME -- CMD...
//	crust-microvm stop [--state-dir DIR] NAME
//
// run stays in the foreground and logs to stderr; it exits 0 after a clean stop (stop, SIGTERM, SIGINT),
// 3 when QEMU died under it (the claims released, the VM not restarted) and 1 on another error. exec prints the command's stdout and stderr and exits with its status (125 when it
// could not be run, 127 when the command is not found in the guest). stop exits 0 once the run process
// is gone. Errors go to stderr as "crust-microvm: message"; a usage error exits 2.
func Main(args []string, stdout, stderr io.Writer) int {
	err := command.Execute(newCommand(stdout, stderr), args, stdout, stderr)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "crust-microvm: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "crust-microvm: %v\n", err)
	if errors.Is(err, ErrVMDied) {
		return ExitVMDied
	}
	if command.IsUsage(err) {
		return ExitUsage
	}
	return 1
}

func newCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "crust-microvm",
		Short:         "crust's reference microVM runtime handler: volumes staged with crustd, mounted inside a QEMU guest",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	command.SetVersion(root)
	stateDir := root.PersistentFlags().String("state-dir", DefaultStateDir, "parent of the sandboxes' state directories")
	root.AddCommand(runCmd(stateDir, stderr), execCmd(stateDir, stdout, stderr), stopCmd(stateDir))
	return root
}

func runCmd(stateDir *string, stderr io.Writer) *cobra.Command {
	cfg := Config{}
	var volumes []string
	var accel string
	var logging command.Logging
	cmd := &cobra.Command{
		Use:   "run --name NAME --crust-socket PATH --volume TARGET:GUEST_PATH...",
		Short: "Boot the sandbox's VM, claim and mount its volumes, serve crustd; stays in the foreground until stopped",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range volumes {
				v, err := ParseVolume(s)
				if err != nil {
					return usageError(fmt.Errorf("--volume: %w", err))
				}
				cfg.Volumes = append(cfg.Volumes, v)
			}
			switch a := vm.Accel(accel); a {
			case vm.AccelTCG, vm.AccelKVM, vm.AccelAuto:
				cfg.Accel = a
			default:
				return usageError(fmt.Errorf("--accel: %q is not tcg, kvm or auto", accel))
			}
			if cfg.Name == "" {
				return usageError(errors.New("--name is required"))
			}
			if err := checkName(cfg.Name); err != nil {
				return usageError(fmt.Errorf("--name: %w", err))
			}
			cfg.StateDir = *stateDir
			var err error
			if cfg.Log, err = logging.Logger(stderr); err != nil {
				return usageError(err)
			}
			ctx, stop := command.SignalContext(cmd.Context())
			defer stop()
			return Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "the sandbox's name, for exec and stop (required)")
	f.StringVar(&cfg.SandboxID, "sandbox-id", "", "the sandbox id the volumes are claimed for in crustd, such as the CRI pod sandbox id (default: --name)")
	command.AddSocketFlag(f, &cfg.CrustSocket, crustd.DefaultSocket, "crustd's socket")
	f.StringArrayVar(&volumes, "volume", nil, "TARGET:GUEST_PATH, a staged target path and where to mount it in the guest (repeatable; a target given again is mounted at that guest path too)")
	f.StringVar(&accel, "accel", string(vm.AccelAuto), "tcg, kvm, or auto (KVM, falling back to TCG when it fails or hangs)")
	logging.AddFlags(f)
	f.StringVar(&cfg.Assets, "assets", envOr("CRUST_GUEST_ASSETS", DefaultAssets), "guest assets: cloud/vmlinux and initramfs-cloud.cpio (env CRUST_GUEST_ASSETS)")
	return cmd
}

func execCmd(stateDir *string, stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec NAME -- CMD...",
		Short: "Run a command in the sandbox's guest; prints its output and exits with its status",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return usageError(errors.New("exec: no command given"))
			}
			res, err := Exec(cmd.Context(), *stateDir, name, argv)
			if err != nil {
				if errors.Is(err, errdefs.ErrNotFound) {
					return exitError{ExitExecNotFound, err}
				}
				return exitError{ExitExecFailed, err}
			}
			_, _ = stdout.Write(res.GetStdout())
			_, _ = stderr.Write(res.GetStderr())
			switch {
			case res.GetTimedOut():
				fmt.Fprintf(stderr, "crust-microvm: the command timed out after %s and was killed\n", ExecTimeout)
			case res.GetTruncated():
				fmt.Fprintf(stderr, "crust-microvm: output truncated at %d bytes\n", agentproto.MaxExecOutput)
			}
			if res.GetExitStatus() != 0 {
				return exitError{code: int(res.GetExitStatus())}
			}
			return nil
		},
	}
	// Everything after NAME is the command, flags included.
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func stopCmd(stateDir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "stop NAME",
		Short: "Stop a sandbox: unmount, detach and release its volumes, stop its VM; returns once its run process is gone",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), teardownTimeout+30*time.Second)
			defer cancel()
			return Stop(ctx, *stateDir, args[0])
		},
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
