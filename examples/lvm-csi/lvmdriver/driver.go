package lvmdriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/unixsocket"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/examples/lvm-csi/internal/lvm"
	"crust.dev/crust/pkg/command"
)

// DefaultName is the plugin name when Config.Name is empty.
const DefaultName = "lvm.test.crust.dev"

// Version is the driver's vendor version.
const Version = "0.1.0"

// Config is the driver's configuration.
type Config struct {
	// Name is the CSI plugin name; DefaultName when empty.
	Name string
	// NodeID is what NodeGetInfo returns; the host name when empty.
	NodeID string
	// VG is the volume group the volumes live in. It must exist.
	VG string
	// Devices are the volume group's physical volumes (lvmtest.VG.Device). LVM looks at these only; empty
	// leaves LVM's scanning as the host configures it.
	Devices []string
	// StateDir is the driver's private directory (the extent map's mount point); a new temporary
	// directory, removed at stop, when empty.
	StateDir string
	// Activation says how volumes become block devices; ActivationAuto when empty.
	Activation Activation
	// CrustSocket is crustd's socket; "" turns deferral off.
	CrustSocket string
	// DefaultFSType is the filesystem of a mount volume whose capability names none; "ext4" when empty.
	DefaultFSType string
	// DefaultCapacity is the size of a volume whose request names none; 128 MiB when zero.
	DefaultCapacity int64
	// NoVolumeContext makes CreateVolume return no volume context, as most drivers do: the
	// StorageClass's crust.dev/defer then reaches the node only through crust-csi-proxy --controller.
	NoVolumeContext bool
	// StrictAccessType makes the node refuse to stage or publish as a raw block device a volume created
	// for filesystem use only, as some drivers do (the CSI spec lets a plugin hold a volume to the
	// capabilities it was created with).
	StrictAccessType bool
	// Capacity makes the driver report topology (the node) and answer GetCapacity with the volume
	// group's free space, for storage capacity tracking.
	Capacity bool
	// Log receives one record per call; slog.Default() when nil.
	Log *slog.Logger
}

// Driver serves the three CSI services. Create it with New.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg      Config
	log      *slog.Logger
	lvm      *lvm.Runner
	act      activator
	crust    *client.Client // nil: deferral off
	mounter  *mount.SafeFormatAndMount
	resizer  *mount.ResizeFs
	ctrlMu   sync.Mutex // serialises the controller's changes to the volume group
	busy     keyLocks   // volume ids with a node call in flight
	tempDir  bool
	closeErr error
	closed   sync.Once
}

// New checks cfg, activates the volumes the driver made earlier (tagged crust-csi) and returns the
// driver. Close releases it.
func New(cfg Config) (*Driver, error) {
	if cfg.VG == "" {
		return nil, errors.New("lvmdriver: Config.VG is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, err
		}
		cfg.NodeID = h
	}
	if cfg.DefaultFSType == "" {
		cfg.DefaultFSType = volume.DefaultFSType
	}
	if !volume.IsFormattedFSType(cfg.DefaultFSType) {
		return nil, fmt.Errorf("lvmdriver: default fs type %q is not one of %s", cfg.DefaultFSType,
			strings.Join(volume.FormattedFSTypes(), ", "))
	}
	if cfg.DefaultCapacity <= 0 {
		cfg.DefaultCapacity = 128 << 20
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	d := &Driver{cfg: cfg, log: cfg.Log}
	if cfg.StateDir == "" {
		dir, err := os.MkdirTemp("", "crust-lvm-csi")
		if err != nil {
			return nil, err
		}
		d.cfg.StateDir, d.tempDir = dir, true
	}
	mode := cfg.Activation
	if mode == ActivationAuto {
		mode = ActivationExtentMap
		if lvm.HasDeviceMapper() {
			mode = ActivationDeviceMapper
		}
	}
	d.lvm = &lvm.Runner{Devices: cfg.Devices, NoActivation: mode == ActivationExtentMap}
	if err := d.lvm.UseSystemDir(filepath.Join(d.cfg.StateDir, "lvm")); err != nil {
		d.cleanupTemp()
		return nil, fmt.Errorf("lvmdriver: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := d.lvm.VG(ctx, cfg.VG); err != nil {
		d.cleanupTemp()
		return nil, fmt.Errorf("lvmdriver: volume group: %w", err)
	}
	switch mode {
	case ActivationDeviceMapper:
		d.act = &deviceMapper{vg: cfg.VG, lvm: d.lvm}
	case ActivationExtentMap:
		m, err := newExtentMap(cfg.VG, d.lvm, filepath.Join(d.cfg.StateDir, "lv"), d.log)
		if err != nil {
			d.cleanupTemp()
			return nil, err
		}
		d.act = m
	default:
		d.cleanupTemp()
		return nil, fmt.Errorf("lvmdriver: unknown activation %q", cfg.Activation)
	}
	d.cfg.Activation = mode
	d.mounter = mount.NewSafeFormatAndMount(mount.New(""), utilexec.New())
	d.resizer = mount.NewResizeFs(utilexec.New())
	if cfg.CrustSocket != "" {
		c, err := client.New(cfg.CrustSocket, client.WithDriverName(cfg.Name))
		if err != nil {
			_ = d.Close()
			return nil, err
		}
		d.crust = c
	}
	lvs, err := d.lvm.LVs(ctx, cfg.VG, "")
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	for _, lv := range lvs {
		if !lv.HasTag(volumeTag) {
			continue
		}
		if _, err := d.act.activate(ctx, lv, false); err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("lvmdriver: activate %s: %w", lv.Name, err)
		}
	}
	d.log.Info("csi driver ready", "name", cfg.Name, "vg", cfg.VG, "activation", mode, "deferral", d.crust != nil)
	return d, nil
}

// Close releases the driver: the crust client, and with ActivationExtentMap the volumes' devices (the
// volumes themselves stay in the volume group). It is safe to call more than once.
func (d *Driver) Close() error {
	d.closed.Do(func() {
		var errs []error
		if d.crust != nil {
			errs = append(errs, d.crust.Close())
		}
		if d.act != nil {
			errs = append(errs, d.act.close())
		}
		d.cleanupTemp()
		d.closeErr = errors.Join(errs...)
	})
	return d.closeErr
}

func (d *Driver) cleanupTemp() {
	if d.tempDir {
		_ = os.RemoveAll(d.cfg.StateDir)
	}
}

// Register adds the driver's three services to s.
func (d *Driver) Register(s *grpc.Server) {
	csi.RegisterIdentityServer(s, d)
	csi.RegisterControllerServer(s, d)
	csi.RegisterNodeServer(s, d)
}

// Start creates the driver and serves it on a unix socket at endpoint (a path, or a unix:// or unix:
// address; a stale socket there is replaced, a live one is an error).
// stop stops serving, waiting for calls in flight, and closes the driver; it returns what Close returned.
func Start(endpoint string, cfg Config) (stop func() error, err error) {
	d, err := New(cfg)
	if err != nil {
		return nil, err
	}
	lis, err := unixsocket.Listen(endpoint)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	// Calls are logged as every crust server logs them; kubelet's routine ones at debug level.
	s := grpc.NewServer(command.StreamWorkers(), grpc.ChainUnaryInterceptor(command.CallLog{Log: d.log, Routine: command.RoutineCSI}.Unary(), errdefs.UnaryServerInterceptor))
	d.Register(s)
	done := make(chan struct{})
	go func() { _ = s.Serve(lis); close(done) }()
	d.log.Info("serving", "endpoint", endpoint)
	return func() error {
		s.GracefulStop()
		<-done
		return d.Close()
	}, nil
}

// keyLocks is a set of keys with a call in flight.
type keyLocks struct {
	mu   sync.Mutex
	keys map[string]bool
}

// tryLock takes key, or fails with Aborted when another call holds it; the returned function releases it.
func (k *keyLocks) tryLock(key string) (func(), error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys[key] {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "an operation on volume %q is in flight", key)
	}
	if k.keys == nil {
		k.keys = map[string]bool{}
	}
	k.keys[key] = true
	return func() {
		k.mu.Lock()
		delete(k.keys, key)
		k.mu.Unlock()
	}, nil
}
