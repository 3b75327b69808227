package command_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/version"
	"crust.dev/crust/pkg/command"
)

func TestLogging(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		wantErr  string // "" : a logger
		debug    bool   // whether Debug is enabled
		warnOnly bool   // whether Info is disabled
		json     bool
	}{
		{name: "defaults", args: nil},
		{name: "debug", args: []string{"--log-level=debug"}, debug: true},
		{name: "warn json", args: []string{"--log-level=warn", "--log-format=json"}, warnOnly: true, json: true},
		{name: "upper case level", args: []string{"--log-level=ERROR"}, warnOnly: true},
		{name: "bad level", args: []string{"--log-level=loud"}, wantErr: `--log-level: "loud" is not debug, info, warn or error`},
		{name: "bad format", args: []string{"--log-format=xml"}, wantErr: `--log-format: "xml" is not text or json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l command.Logging
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			l.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log, err := l.Logger(&buf)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Logger: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if got := log.Enabled(ctx, -4); got != tc.debug {
				t.Errorf("debug enabled = %v, want %v", got, tc.debug)
			}
			if got := !log.Enabled(ctx, 0); got != tc.warnOnly {
				t.Errorf("info disabled = %v, want %v", got, tc.warnOnly)
			}
			log.Error("hello", "k", "v")
			if tc.json != json.Valid(buf.Bytes()) {
				t.Errorf("json = %v, but wrote %q", tc.json, buf.String())
			}
			if !strings.Contains(buf.String(), "hello") {
				t.Errorf("wrote %q", buf.String())
			}
		})
	}
}

func TestSocketFlag(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		want, old string
	}{
		{name: "default", want: "/def.sock"},
		{name: "env", env: "/env.sock", want: "/env.sock"},
		{name: "flag beats env", env: "/env.sock", args: []string{"--crust-socket=/flag.sock"}, want: "/flag.sock"},
		{name: "old name", args: []string{"--socket", "/old.sock"}, want: "/old.sock", old: "--socket"},
		{name: "old name beats env", env: "/env.sock", args: []string{"--socket=/old.sock"}, want: "/old.sock", old: "--socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(command.SocketEnv, tc.env)
			var got string
			fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
			command.AddSocketFlag(fs, &got, "/def.sock", "crustd's socket", "socket")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("socket = %q, want %q", got, tc.want)
			}
			if old := command.OldSocketFlag(fs); old != tc.old {
				t.Errorf("OldSocketFlag = %q, want %q", old, tc.old)
			}
			if !fs.Lookup("socket").Hidden {
				t.Error("the old name is shown in the help")
			}
			if u := fs.Lookup(command.SocketFlag).Usage; !strings.Contains(u, command.SocketEnv) {
				t.Errorf("usage %q does not name %s", u, command.SocketEnv)
			}
		})
	}
}

// The flag and api/client read the same variable.
func TestSocketEnvIsClients(t *testing.T) {
	if command.SocketEnv != crustd.SocketEnv {
		t.Fatalf("command.SocketEnv %q, crustd.SocketEnv %q", command.SocketEnv, crustd.SocketEnv)
	}
	t.Setenv(command.SocketEnv, "/agree.sock")
	var got string
	command.AddSocketFlag(pflag.NewFlagSet("x", pflag.ContinueOnError), &got, crustd.DefaultSocket, "s")
	if got != crustd.SocketFromEnv() {
		t.Errorf("flag default %q, crustd.SocketFromEnv %q", got, crustd.SocketFromEnv())
	}
}

func TestVersion(t *testing.T) {
	want := "tool version " + version.Get().String() + "\n"
	for _, tc := range []struct {
		name string
		args []string
		more string
	}{
		{name: "flag", args: []string{"--version"}},
		{name: "subcommand", args: []string{"version"}},
		{name: "subcommand with more", args: []string{"version"}, more: "server: v1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }}
			command.SetVersion(root)
			root.AddCommand(command.VersionCommand(func(_ *cobra.Command, w io.Writer) error {
				_, err := w.Write([]byte(tc.more))
				return err
			}))
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetArgs(tc.args)
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != want+tc.more {
				t.Errorf("printed %q, want %q", got, want+tc.more)
			}
		})
	}
}

func TestSignalContext(t *testing.T) {
	ctx, stop := command.SignalContext(context.Background())
	defer stop()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done() // the test times out if SIGTERM does not end it
}

func TestServer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		ran     bool
	}{
		{name: "runs", args: nil, ran: true},
		{name: "json", args: []string{"--log-format", "json"}, ran: true},
		{name: "bad level", args: []string{"--log-level", "x"}, wantErr: "--log-level"},
		{name: "no arguments", args: []string{"extra"}, wantErr: "unknown command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			cmd := command.Server("srv", "a server", func(ctx context.Context, _ *cobra.Command, log *slog.Logger) error {
				ran = true
				if ctx.Err() != nil {
					t.Error("the context ended before run")
				}
				log.Info("served")
				return nil
			})
			var stderr bytes.Buffer
			cmd.SetErr(&stderr)
			cmd.SetOut(io.Discard)
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Execute: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || ran != tc.ran {
				t.Fatalf("Execute: %v, ran %v", err, ran)
			}
			if log := stderr.String(); !strings.Contains(log, "starting") || !strings.Contains(log, version.Get().Version) || !strings.Contains(log, "served") {
				t.Errorf("log %q lacks the start-up line or run's", log)
			}
		})
	}
}

func TestExecuteUsage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool // whether the error is a usage error; nil error when false and ok
		ok    bool
	}{
		{name: "ok", args: []string{"sub", "a"}, ok: true},
		{name: "unknown flag", args: []string{"sub", "--nope", "a"}, usage: true},
		{name: "bad flag value", args: []string{"sub", "--n", "x", "a"}, usage: true},
		{name: "unknown command", args: []string{"nope"}, usage: true},
		{name: "too many arguments", args: []string{"sub", "a", "b"}, usage: true},
		{name: "usage error of the command", args: []string{"sub", "bad"}, usage: true},
		{name: "other error", args: []string{"sub", "fail"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := &cobra.Command{Use: "tool", SilenceErrors: true, SilenceUsage: true}
			sub := &cobra.Command{Use: "sub", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
				switch args[0] {
				case "bad":
					return command.UsageError{Err: errors.New("bad argument")}
				case "fail":
					return errors.New("failed")
				}
				return nil
			}}
			sub.Flags().Int("n", 0, "a number")
			root.AddCommand(sub)
			err := command.Execute(root, tc.args, io.Discard, io.Discard)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || command.IsUsage(err) != tc.usage {
				t.Errorf("Execute: %v; IsUsage = %v, want %v", err, err != nil && command.IsUsage(err), tc.usage)
			}
		})
	}
}
