// Package daemon wires crustd together: it loads the store, opens the core (internal/manager) with the
// store, the validator, the forwarder, the host's mount check (internal/hostdev), the handler socket check
// (internal/validate) and the Kata adapter (internal/katadir: the projection, Kata's claims and caveats)
// injected, serves the API on the unix socket and metrics over HTTP, watches runtime handlers, collects
// the descriptors of deleted pods, and stops cleanly on a signal: it ends the watch streams, waits for the
// calls in flight, and keeps the watch revision (manager.Close) so that watches resume across the restart.
// Start-up fails on a bad configuration or an unusable directory, never on one bad record.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/internal/crisandbox"
	"crust.dev/crust/internal/forward"
	"crust.dev/crust/internal/handlerwatch"
	"crust.dev/crust/internal/hostdev"
	"crust.dev/crust/internal/katadir"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/metrics"
	"crust.dev/crust/internal/peercred"
	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/internal/server"
	"crust.dev/crust/internal/store"
	"crust.dev/crust/internal/validate"
	"crust.dev/crust/pkg/command"
)

// Config is crustd's configuration; the flags of NewCommand fill it.
type Config struct {
	Socket   string
	StateDir string
	// StoreWriteVersion is the record format version the store writes (store.Options.WriteVersion): by
	// default the one the previous release reads, so that a rollback keeps every descriptor; 0 means the
	// store's default. Records of every version the store knows are read whatever it is.
	StoreWriteVersion int
	KataDir           string   // "" disables the Kata projection
	KataShimDirs      []string // where Kata shims serve stats and resize, tried in order; empty: Kata's defaults
	KubeletDir        string
	DeviceAllow       []string
	// DeviceAllowKinds are the kinds of block device allowed (loop, dm, ...), decided from sysfs; empty
	// allows every kind.
	DeviceAllowKinds []string
	AllowFileBacked  bool
	MetadataKeys     []string
	// AllowMountOptions are the privileged mount options (dev, suid) descriptors may carry.
	AllowMountOptions []string
	AllowUIDs         []uint32
	AllowGIDs         []uint32
	HTTPAddr          string // "" disables metrics and health over HTTP
	// MetricsSecure is the authenticated /metrics endpoint (off by default).
	MetricsSecure metrics.Secure
	LockWait      time.Duration
	GCInterval    time.Duration
	// HandlerGrace is how long a runtime handler's endpoint may refuse before its claims are released;
	// 0 disables the release (see handlerwatch).
	HandlerGrace time.Duration
	LogLevel     slog.Level
	LogFormat    string // text or json

	// CRIEndpoint is the CRI runtime's socket, asked for the Kata sandbox of a volume that no sandbox-id
	// file names (runtime-rs); "" turns that discovery off.
	CRIEndpoint string
	// CRITimeout bounds each call to the CRI runtime.
	CRITimeout time.Duration
}

// Defaults returns crustd's default configuration, the flags' defaults.
func Defaults() Config {
	return Config{
		Socket:            "/run/crust/crust.sock",
		StateDir:          "/run/crust",
		StoreWriteVersion: store.DefaultWriteVersion,
		KataDir:           kata.DefaultDir,
		KataShimDirs:      kata.DefaultShimDirs(),
		CRIEndpoint:       crisandbox.DefaultEndpoint,
		CRITimeout:        crisandbox.DefaultTimeout,
		KubeletDir:        "/var/lib/kubelet",
		DeviceAllow:       []string{"/dev/*"},
		AllowUIDs:         []uint32{0},
		HTTPAddr:          "127.0.0.1:9809",
		LockWait:          2 * time.Second,
		GCInterval:        time.Minute,
		HandlerGrace:      handlerwatch.DefaultGrace,
		LogFormat:         "text",
	}
}

// Run serves until ctx ends, then stops gracefully. It returns an error when start-up fails.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	start := time.Now()
	if cfg.GCInterval <= 0 {
		return fmt.Errorf("--gc-interval %s: must be positive", cfg.GCInterval)
	}
	if v := cfg.StoreWriteVersion; v != 0 && (v < store.OldestVersion || v > store.NewestVersion) {
		return fmt.Errorf("--store-write-version %d: must be a record format version from %d to %d", v, store.OldestVersion, store.NewestVersion)
	}
	v, err := validate.New(validate.Config{
		KubeletDir: cfg.KubeletDir, DeviceAllow: cfg.DeviceAllow, DeviceAllowKinds: cfg.DeviceAllowKinds,
		AllowFileBacked: cfg.AllowFileBacked, MetadataKeys: cfg.MetadataKeys, AllowMountOptions: cfg.AllowMountOptions,
	})
	if err != nil {
		return err
	}
	bootID, err := recordfile.ReadBootID()
	if err != nil {
		return err
	}
	// One crustd per state directory: the store holds it until crustd ends, and a second one exits at
	// once, naming the first.
	st, loaded, err := store.OpenWith(cfg.StateDir, bootID, store.Options{WriteVersion: cfg.StoreWriteVersion, Log: log})
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	defer st.Close()
	proj, err := katadir.New(cfg.KataDir)
	if err != nil {
		return err
	}
	fwd := &forward.Forwarder{KataShimDirs: cfg.KataShimDirs}
	defer func() { _ = fwd.Close() }()
	var (
		sandboxes handlerwatch.Sandboxes
		finder    katadir.SandboxFinder
		discover  func(context.Context) []string
	)
	if cfg.CRIEndpoint != "" {
		f, err := crisandbox.New(crisandbox.Config{Endpoint: cfg.CRIEndpoint, ShimDirs: cfg.KataShimDirs, Timeout: cfg.CRITimeout, Log: log})
		if err != nil {
			return fmt.Errorf("--cri-endpoint: %w", err)
		}
		defer func() { _ = f.Close() }()
		sandboxes, finder = f, f
	}
	katas := katadir.NewAdapter(proj, finder, log)
	m, err := manager.Open(manager.Config{
		Validator: v, Store: st, Subscribers: []manager.Subscriber{katas}, Claims: katas, Forwarder: fwd,
		Mounts: hostdev.MountCheck{}, Devices: hostdev.Sysfs{}, Sockets: validate.HandlerSockets{Dirs: []string{handlerSocketDir(cfg.Socket)}},
		Revisions: st, KubeletDir: cfg.KubeletDir, LockWait: cfg.LockWait, Log: log,
	}, manager.Loaded(*loaded))
	if err != nil {
		return err
	}
	katas.Bind(m)
	if finder != nil {
		discover = katas.FindAll
	}
	log.Info("state loaded", "volumes", len(loaded.Volumes), "dropped_other_boot", len(loaded.Dropped),
		"corrupt_moved_aside", len(loaded.Corrupt), "state_dir", cfg.StateDir, "kata_dir", cfg.KataDir)

	met := metrics.New()
	met.VolumeGauges(m.Counts)
	met.QuarantineGauge(m.ProblemCounts)
	srv := server.New(server.Config{
		Manager: m, Annotators: []server.Annotator{katas}, Policy: peercred.Policy{UIDs: cfg.AllowUIDs, GIDs: cfg.AllowGIDs}, Metrics: met,
		Features: features(cfg), Log: log,
	})
	lis, err := unixsocket.Listen(cfg.Socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Socket, err)
	}
	// Every listener is bound before any is served, so that an answer on one means the others listen.
	errc := make(chan error, 3)
	stopHTTP, err := met.Serve(cfg.HTTPAddr, cfg.MetricsSecure, log, errc)
	if err != nil {
		_ = lis.Close()
		return err
	}
	defer stopHTTP()
	go func() { errc <- srv.GRPC.Serve(lis) }()
	srv.SetServing(true)
	met.SetReady(true)
	log.Info("serving", "socket", cfg.Socket, "http", cfg.HTTPAddr, "metrics_secure", cfg.MetricsSecure.Addr, "start_took", time.Since(start))

	hw := handlerwatch.New(handlerwatch.Config{Manager: m, Grace: cfg.HandlerGrace, Released: met.HandlerGone, Sandboxes: sandboxes,
		Discover: discover, Log: log})
	hwCtx, hwStop := context.WithCancel(ctx)
	hwDone := make(chan struct{})
	go func() { hw.Run(hwCtx); close(hwDone) }()
	defer func() { hwStop(); <-hwDone }()

	gcCtx, gcStop := context.WithCancel(ctx)
	gcDone := make(chan struct{})
	go func() { collect(gcCtx, m, met, cfg.KubeletDir, cfg.GCInterval, log); close(gcDone) }()
	defer func() { gcStop(); <-gcDone }()

	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	log.Info("stopping")
	gcStop() // no pass while the calls drain
	met.SetReady(false)
	srv.SetServing(false)
	stopped := make(chan struct{})
	go func() { srv.GRPC.GracefulStop(); close(stopped) }()
	m.EndWatches() // watch streams last until ended: end them, and they resume once crustd is back
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.GRPC.Stop()
	}
	// Nothing changes the descriptors any more: keep the revision as the last one, so that watches resume
	// across the restart.
	hwStop()
	<-hwDone
	gcStop()
	<-gcDone
	if cerr := m.Close(); cerr != nil {
		log.Error("keep the watch revision at stop; watches will not resume across the restart", "err", cerr)
	}
	return err
}

// features are the features a crustd of cfg serves, as GetInfo names them (api/crustd's Feature*
// constants; crust.proto's GetInfoResponse says what each promises).
func features(cfg Config) []string {
	f := []string{crustd.FeatureWatchResume, crustd.FeatureHandlerSocketCheck, crustd.FeatureHostMountCheck,
		crustd.FeatureRawBlock, crustd.FeatureIOLimits, crustd.FeaturePmem, crustd.FeatureExpandUnclaimed, crustd.FeatureNodeHolds,
		crustd.FeatureRawDeviceCheck}
	for _, c := range []struct {
		on      bool
		feature string
	}{
		{cfg.AllowFileBacked, crustd.FeatureFileBacked},
		{cfg.KataDir != "", crustd.FeatureKataProjection},
		{cfg.CRIEndpoint != "", crustd.FeatureKataCRIDiscovery},
		{cfg.HandlerGrace > 0, crustd.FeatureHandlerGoneRelease},
	} {
		if c.on {
			f = append(f, c.feature)
		}
	}
	return f
}

// handlerSocketDir is where crustd, serving at socket, tells handlers to keep their sockets: the
// handlers/ directory beside its own, which it always sees.
func handlerSocketDir(socket string) string {
	return filepath.Join(filepath.Dir(socket), crustd.HandlerSocketDir)
}

// NewCommand returns the crustd command.
func NewCommand() *cobra.Command {
	cfg := Defaults()
	var uids, gids []uint
	cmd := command.Server("crustd", "crust node daemon: holds deferred-mount descriptors for microVM runtimes",
		func(ctx context.Context, cmd *cobra.Command, log *slog.Logger) error {
			_ = cfg.LogLevel.UnmarshalText([]byte(cmd.Flag("log-level").Value.String())) // checked by command.Server
			cfg.LogFormat = cmd.Flag("log-format").Value.String()
			if old := command.OldSocketFlag(cmd.Flags()); old != "" {
				log.Warn(old+" is an old name of --"+command.SocketFlag, "socket", cfg.Socket)
			}
			var err error
			if cfg.AllowUIDs, err = toUint32("--allow-uid", uids); err != nil {
				return err
			}
			if cfg.AllowGIDs, err = toUint32("--allow-gid", gids); err != nil {
				return err
			}
			return Run(ctx, cfg, log)
		})
	f := cmd.Flags()
	command.AddSocketFlag(f, &cfg.Socket, cfg.Socket, "unix socket to serve the API on (created 0600)", "socket")
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory of the crash-safe descriptor store")
	f.IntVar(&cfg.StoreWriteVersion, "store-write-version", cfg.StoreWriteVersion, fmt.Sprintf(
		"record format version the store writes, %d to %d (records of every one are read); at start, records of a newer one are rewritten in it. "+
			"The default is the newest the previous release reads, so that a rollback keeps every descriptor: 1 (v0.1.0 reads 1 alone) until v0.3.0 makes it 2",
		store.OldestVersion, store.NewestVersion))
	f.StringVar(&cfg.KataDir, "kata-dir", cfg.KataDir, `Kata direct-volume directory to project descriptors into ("" disables)`)
	f.StringSliceVar(&cfg.KataShimDirs, "kata-shim-dirs", cfg.KataShimDirs,
		"directories of Kata sandboxes, tried in order for <dir>/<sandbox id>/shim-monitor.sock (stats and resize of volumes a Kata shim uses)")
	f.StringVar(&cfg.CRIEndpoint, "cri-endpoint", cfg.CRIEndpoint,
		`CRI runtime socket asked for the Kata sandbox of a volume no sandbox-id file names (Kata runtime-rs); "" disables`)
	f.DurationVar(&cfg.CRITimeout, "cri-timeout", cfg.CRITimeout, "how long one call to the CRI runtime may take")
	f.StringVar(&cfg.KubeletDir, "kubelet-dir", cfg.KubeletDir, "kubelet root; target paths must lie under it")
	f.StringSliceVar(&cfg.DeviceAllow, "device-allow", cfg.DeviceAllow, "glob a device must match after symlinks are resolved, "+
		"as must the kernel's name for a block device outside /dev (repeatable)")
	f.StringSliceVar(&cfg.DeviceAllowKinds, "device-allow-kind", nil, "kinds of block device allowed, decided from sysfs: "+
		"loop, dm, md, nvme, pmem, virtio, scsi, rbd, other (comma-separated or repeatable; every kind when unset)")
	f.BoolVar(&cfg.AllowFileBacked, "allow-file-backed", false, "accept regular image files as volumes (VOLUME_TYPE_FILE)")
	f.StringSliceVar(&cfg.MetadataKeys, "metadata-key", nil, "extra metadata key to accept (repeatable)")
	f.StringSliceVar(&cfg.AllowMountOptions, "allow-mount-option", nil, "privileged mount option to accept in descriptors: dev or suid (repeatable; none by default)")
	f.UintSliceVar(&uids, "allow-uid", []uint{0}, "peer uid allowed to call (repeatable)")
	f.UintSliceVar(&gids, "allow-gid", nil, "peer gid allowed to call (repeatable)")
	f.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, `address for /metrics, /healthz, /readyz ("" disables)`)
	cfg.MetricsSecure.AddFlags(f)
	f.DurationVar(&cfg.LockWait, "lock-wait", cfg.LockWait, "how long a call waits for another on the same target before ABORTED")
	f.DurationVar(&cfg.GCInterval, "gc-interval", cfg.GCInterval, "how often the descriptors of every deleted pod are looked for (a pod whose directory is seen going is collected at once)")
	f.DurationVar(&cfg.HandlerGrace, "handler-grace", cfg.HandlerGrace,
		"release a runtime handler's claims once its endpoint has refused connections this long (at once when the claiming process has exited too); 0 never releases")
	return cmd
}

func toUint32(flag string, in []uint) ([]uint32, error) {
	out := make([]uint32, len(in))
	for i, v := range in {
		if v > math.MaxUint32 {
			return nil, fmt.Errorf("%s: %d is not a valid id", flag, v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}
