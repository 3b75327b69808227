// Package registrar registers a CSI driver with kubelet through kubelet's plugin-registration API
// (k8s.io/kubelet pluginregistration/v1), as node-driver-registrar does. It exists for crust's cluster
// tests, where node-driver-registrar cannot be built (its module is not served); operators keep their
// driver's own registrar. It accepts node-driver-registrar's flags so that a deployment written for that
// image runs unchanged with this one.
//
// What it promises: it learns the driver's name from GetPluginInfo on the driver's socket (waiting for the
// socket to answer), then serves Registration on <plugin-registration-path>/<driver>-reg.sock, answering
// GetInfo with the driver's name and the kubelet-side socket path. It replaces a stale socket of an
// earlier run and removes its own at stop. Health (/healthz on --http-endpoint) is ok while the
// registration socket exists and the driver answers GetPluginInfo.
package registrar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/api/version"
	"crust.dev/crust/pkg/command"
)

// Config is what the flags set.
type Config struct {
	// CSIAddress is the driver's socket as this process sees it.
	CSIAddress string
	// KubeletRegistrationPath is the driver's socket as kubelet sees it (a host path).
	KubeletRegistrationPath string
	// PluginRegistrationPath is the directory kubelet's plugin watcher scans (mounted from
	// <kubelet>/plugins_registry).
	PluginRegistrationPath string
	// HTTPEndpoint serves /healthz when not empty.
	HTTPEndpoint string
	// Timeout bounds each call to the driver.
	Timeout time.Duration
}

// Main parses args as node-driver-registrar's flags and runs until ctx ends. It returns the exit status.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := pflag.NewFlagSet("crust-test-registrar", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	fs.StringVar(&cfg.CSIAddress, "csi-address", "/run/csi/socket", "the driver's CSI socket, as this container sees it")
	fs.StringVar(&cfg.KubeletRegistrationPath, "kubelet-registration-path", "", "the driver's CSI socket as kubelet sees it (required)")
	fs.StringVar(&cfg.PluginRegistrationPath, "plugin-registration-path", "/registration", "kubelet's plugin registration directory, as mounted here")
	fs.StringVar(&cfg.HTTPEndpoint, "http-endpoint", "", "address for /healthz; empty disables it")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Second, "timeout of each call to the driver")
	fs.Int("v", 0, "accepted for compatibility; use --log-level")
	var logging command.Logging
	logging.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stderr, command.Version("crust-test-registrar"))
		return 0
	}
	if cfg.KubeletRegistrationPath == "" {
		fmt.Fprintln(stderr, "crust-test-registrar: --kubelet-registration-path is required")
		return 2
	}
	log, err := logging.Logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "crust-test-registrar:", err)
		return 2
	}
	if err := Run(ctx, cfg, log); err != nil {
		log.Error("registrar stopped", "err", err)
		return 1
	}
	return 0
}

// Run registers the driver and serves until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	conn, err := grpc.NewClient("unix://"+cfg.CSIAddress, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(version.UserAgent()))
	if err != nil {
		return fmt.Errorf("--csi-address: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ids := csi.NewIdentityClient(conn)
	name, err := driverName(ctx, ids, cfg.Timeout, log)
	if err != nil {
		return err
	}
	sock := filepath.Join(cfg.PluginRegistrationPath, name+"-reg.sock")
	l, err := unixsocket.Listen(sock)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &server{name: name, endpoint: cfg.KubeletRegistrationPath, log: log})
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(l) }()
	log.Info("registration socket ready", "driver", name, "socket", sock, "endpoint", cfg.KubeletRegistrationPath)
	var hs *http.Server
	if cfg.HTTPEndpoint != "" {
		hs = &http.Server{Addr: cfg.HTTPEndpoint, ReadHeaderTimeout: 5 * time.Second, Handler: health(sock, ids, cfg.Timeout)}
		go func() {
			if err := hs.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
	}
	if hs != nil {
		_ = hs.Close()
	}
	srv.Stop() // closes the listener, which removes the socket
	return err
}

// driverName asks the driver for its name, retrying until it answers or ctx ends: the driver's container
// may start after this one.
func driverName(ctx context.Context, ids csi.IdentityClient, timeout time.Duration, log *slog.Logger) (string, error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := ids.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && resp.GetName() != "" {
			return resp.GetName(), nil
		}
		if err == nil {
			err = errors.New("GetPluginInfo returned no name")
		}
		log.Info("waiting for the driver", "err", err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

type server struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
	log            *slog.Logger
}

func (s *server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.name,
		Endpoint:          s.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		s.log.Info("kubelet registered the driver", "driver", s.name)
	} else {
		s.log.Error("kubelet refused the driver", "driver", s.name, "err", st.GetError())
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func health(sock string, ids csi.IdentityClient, timeout time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
			http.Error(w, "registration socket missing", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		if _, err := ids.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
			http.Error(w, "driver: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}
