package vmhandler

import (
	"context"
	"errors"
	"log/slog"
	"path"
	"sync"

	"crust.dev/crust/api/errdefs"
	crusthandler "crust.dev/crust/api/handler"
	"crust.dev/crust/examples/microvm/vm"
)

// VolumeDir is the guest directory under which Volumes mounts each volume, at DiskID(target).
const VolumeDir = "/run/crust/volumes"

// VolumesConfig describes the volume side of a sandbox whose VM runs already.
type VolumesConfig struct {
	// SandboxID is the sandbox id the volumes are claimed for.
	SandboxID string
	// Crust is crustd's client; it stays the caller's.
	Crust *crusthandler.Client
	// VM is the sandbox's VM, booted.
	VM *vm.VM
	// HandlerSocket is where RuntimeHandlerService is served for crustd (api/handler ServeHandler).
	HandlerSocket string
	// Log receives the volumes' log; nil means slog.Default().
	Log *slog.Logger
}

// Volumes attaches crust's volumes to a running sandbox one at a time, as its containers ask for them,
// with what Run promises of each volume (see the package documentation): claimed for the sandbox, its
// device checked, hot-plugged, mounted in the guest, its stats and expansion served to crustd, its claim
// kept while it is mounted (KeepClaims), and released at Teardown.
type Volumes struct {
	s       *sandbox
	stop    func()
	endWork context.CancelFunc
	wg      sync.WaitGroup
	once    sync.Once
	err     error
}

// ServeVolumes serves RuntimeHandlerService at cfg.HandlerSocket and keeps the claims of the volumes
// attached later until Teardown.
func ServeVolumes(cfg VolumesConfig) (*Volumes, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := newSandbox(cfg.SandboxID, cfg.Crust, cfg.VM, nil, cfg.Log)
	stop, endpoint, err := crusthandler.ServeHandler(cfg.HandlerSocket, s)
	if err != nil {
		return nil, err
	}
	s.endpoint = endpoint
	work, endWork := context.WithCancel(context.Background())
	v := &Volumes{s: s, stop: stop, endWork: endWork}
	v.wg.Go(func() { s.keepClaims(work) })
	return v, nil
}

// Attached is a volume Attach mounted in the guest.
type Attached struct {
	// GuestPath is where it is: a mounted filesystem, or for a raw block volume a device node.
	GuestPath string
	ReadOnly  bool
	Block     bool
}

// Attach claims the volume staged at target for the sandbox and mounts it in the guest at
// VolumeDir/DiskID(target), or answers the volume mounted there already. A target crustd holds nothing
// for is errdefs.ErrNotFound: an ordinary mount, not a crust volume. On any other error nothing of the
// volume is held.
func (v *Volumes) Attach(ctx context.Context, target string) (Attached, error) {
	s := v.s
	vol := s.add(Volume{Target: target, GuestPath: path.Join(VolumeDir, DiskID(target))})
	ok, err := s.attach(ctx, vol, s.log.With("target", target, "guest_path", vol.GuestPath))
	if !ok {
		s.remove(vol)
		if err == nil {
			err = errdefs.Errorf(errdefs.ErrNotFound, "nothing is staged at %s", target)
		}
		return Attached{}, err
	}
	vol.mu.Lock()
	defer vol.mu.Unlock()
	return Attached{GuestPath: vol.GuestPath, ReadOnly: vol.readOnly, Block: vol.block}, nil
}

// Teardown stops serving crustd, unmounts, detaches and releases every volume, and stops the VM (see
// Run's stop); calling it again answers the first call's error.
func (v *Volumes) Teardown(ctx context.Context) error {
	v.once.Do(func() {
		v.endWork()
		v.wg.Wait()
		v.stop()
		v.err = v.s.teardown(ctx)
	})
	return v.err
}

// ErrNotDeferred reports whether err, from Attach, says the target is an ordinary mount.
func ErrNotDeferred(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
