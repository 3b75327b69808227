// Package command is the command-line plumbing every crust binary shares, so that they all read the
// same: --log-level and --log-format and the one slog logger they set up, --version, the flag that
// names crustd's API socket (--crust-socket, env CRUST_SOCKET), a context that ends on SIGINT or
// SIGTERM, and the one way a gRPC server logs its calls (CallLog). Flags are spf13/pflag's (through cobra) in every binary crust ships; only the build tools
// under hack/, which nobody runs but make, parse theirs with the standard library.
//
// It is public because the reference runtime handler and CSI driver (their own Go modules, which may not
// import crustd's insides) use it, and so may a runtime or driver author who wants the same conventions.
// It carries no crust behaviour: nothing here dials or serves.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"crust.dev/crust/api/version"
)

// SocketFlag is the one spelling, in every binary, of the flag that names crustd's API socket.
const SocketFlag = "crust-socket"

// SocketEnv is the environment variable that names crustd's API socket when the flag is not given.
const SocketEnv = "CRUST_SOCKET"

// Logging is what --log-level and --log-format chose. The zero value logs at info, as text.
type Logging struct {
	Level  string // debug, info, warn or error (or a slog level such as info+2)
	Format string // text or json
}

// AddFlags registers --log-level and --log-format on fs, with l's fields (or info and text) as defaults.
func (l *Logging) AddFlags(fs *pflag.FlagSet) {
	if l.Level == "" {
		l.Level = "info"
	}
	if l.Format == "" {
		l.Format = "text"
	}
	fs.StringVar(&l.Level, "log-level", l.Level, "debug, info, warn or error")
	fs.StringVar(&l.Format, "log-format", l.Format, "text or json")
}

// Logger returns the logger l describes, writing to w. A bad level or format is an error that names its
// flag.
func (l Logging) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if l.Level != "" {
		if err := level.UnmarshalText([]byte(l.Level)); err != nil {
			return nil, fmt.Errorf("--log-level: %q is not debug, info, warn or error", l.Level)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.Format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", l.Format)
}

// AddSocketFlag registers --crust-socket on fs, storing into p. Its default is $CRUST_SOCKET when that
// is set, else def, so that the environment variable works wherever the flag does (api/client's
// SocketFromEnv reads the same variable). usage says what the socket is for; the flag's help adds the
// variable. Each of oldNames is registered as a hidden alias that sets the same value, for command lines
// written before the flag had one spelling; OldSocketFlag says whether one was used.
func AddSocketFlag(fs *pflag.FlagSet, p *string, def, usage string, oldNames ...string) {
	if env := os.Getenv(SocketEnv); env != "" {
		def = env
	}
	fs.StringVar(p, SocketFlag, def, usage+" (env "+SocketEnv+")")
	for _, n := range oldNames {
		fs.StringVar(p, n, def, "old name of --"+SocketFlag)
		_ = fs.MarkHidden(n)
		_ = fs.SetAnnotation(n, oldNameAnnotation, []string{SocketFlag})
	}
}

const oldNameAnnotation = "crust.dev/old-name-of"

// OldSocketFlag returns the old name of --crust-socket that the command line used ("--socket"), or "".
func OldSocketFlag(fs *pflag.FlagSet) string {
	var used string
	fs.Visit(func(f *pflag.Flag) {
		if len(f.Annotations[oldNameAnnotation]) > 0 {
			used = "--" + f.Name
		}
	})
	return used
}

// SignalContext returns a context that ends on SIGINT or SIGTERM (or when ctx ends); stop releases the
// signals.
func SignalContext(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// SetVersion gives cmd a --version flag that prints "NAME version VERSION (revision R, GO)" and exits 0.
func SetVersion(cmd *cobra.Command) {
	cmd.Version = version.Get().String()
}

// Version is the line --version prints for the binary called name.
func Version(name string) string {
	return name + " version " + version.Get().String()
}

// VersionCommand returns a `version` subcommand that prints Version(root's name), then what more
// reports (such as the server's version), if more is not nil.
func VersionCommand(more func(cmd *cobra.Command, w io.Writer) error) *cobra.Command {
	return &cobra.Command{
		Use: "version", Short: "Print the version of this binary", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			fmt.Fprintln(w, Version(cmd.Root().Name()))
			if more == nil {
				return nil
			}
			return more(cmd, w)
		},
	}
}

// Server returns the root command of a binary that serves until it is stopped: it takes no arguments,
// answers --version, has --log-level and --log-format, and when run sets up the logger (to stderr), logs
// its version at start-up, and calls run with a context that ends on SIGINT or SIGTERM. run's error is
// the command's; cobra prints it, once, after "Error: ".
func Server(use, short string, run func(ctx context.Context, cmd *cobra.Command, log *slog.Logger) error) *cobra.Command {
	var logging Logging
	cmd := &cobra.Command{
		Use:          use,
		Short:        short,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logging.Logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, stop := SignalContext(cmd.Context())
			defer stop()
			v := version.Get()
			log.Info("starting", "version", v.Version, "revision", v.Revision, "goversion", v.GoVersion)
			return run(ctx, cmd, log)
		},
	}
	SetVersion(cmd)
	logging.AddFlags(cmd.Flags())
	return cmd
}

// UsageError marks a mistake in the command line; by convention the binary exits 2 for it.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// IsUsage says whether err is a mistake in the command line: a UsageError (which Execute makes of every
// flag error), or cobra's unknown command or wrong number of arguments.
func IsUsage(err error) bool {
	var ue UsageError
	return errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") || strings.Contains(err.Error(), "arg(s)")
}

// Execute runs cmd with args, writing to stdout and stderr, and returns its error; a flag error comes
// back as a UsageError.
func Execute(cmd *cobra.Command, args []string, stdout, stderr io.Writer) error {
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	return cmd.Execute()
}
