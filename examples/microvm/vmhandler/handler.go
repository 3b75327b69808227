// Package vmhandler is crust-microvm, crust's reference runtime handler. One run process serves one sandbox:
// it boots a QEMU microVM (package vm), claims the sandbox's volumes from crustd, hot-plugs each device into
// the VM and mounts it in the guest, and answers the stats and expansion requests crustd forwards to it.
// Other processes reach a running sandbox through Exec and Stop.
//
// A sandbox's files live in StateDir/NAME:
//
//	lock          flock'ed by the run process for its whole life: a free lock means nobody runs NAME
//	handler.sock  RuntimeHandlerService, for crustd (the endpoint given to ClaimVolume)
//	control.sock  exec and stop, for other crust-microvm processes
//	qemu.pid      QEMU's pid, to clean up after a run that was killed
//	qmp.sock, agent.sock, console.log, qemu.log: the VM's own (package vm)
//
// What Run promises:
//   - Each volume is claimed for sandbox NAME; its device is checked against the descriptor's device number,
//     hot-plugged (read-only when the descriptor says so) as a virtio-blk disk whose serial is
//     DiskID(target), and mounted at its guest path with the descriptor's fs type, mount flags, read-only
//     flag, fsGroup and policy, and create_filesystem. A read-write ext2/3/4 or xfs filesystem smaller than
//     its disk (the volume was expanded while no sandbox held it) is grown to fill the disk once mounted.
//   - A target given with several guest paths is claimed once, attached as one disk, mounted at the first
//     guest path and mounted again (the same filesystem) at each other one, so that every container of the
//     pod sees the same files; stats and expansion answer for the volume. It is unmounted everywhere
//     before its disk is detached.
//   - A volume whose metadata holds an encryptionKey is a LUKS2 volume opened in the guest with that key
//     (formatted as LUKS2 first when it is blank and create_filesystem is set); the filesystem lies on the
//     mapping, which stats and expansion go through. The key goes to the guest alone and is never logged.
//     Kata's "ephemeral" key, and an encrypted raw block or persistent-memory volume, are refused and
//     released: mounting them in the clear would defeat the request.
//   - A persistent-memory volume (VOLUME_TYPE_PMEM) is hot-plugged as a virtio-pmem device instead (package
//     vm, AttachPmem; read-only mapped read-only) and mounted with DAX (-o dax). QEMU cannot unplug it, so it
//     stays in the VM until the VM stops: detaching it (at stop, or after a failed mount) only unmounts it,
//     and its claim is kept, and claimed again if crustd ends it, until QEMU has exited; only then is it
//     released. Its expansion is UNIMPLEMENTED.
//   - A target with nothing staged is waited for and attached as soon as it is staged, however long after
//     boot. A volume that fails (claimed by another sandbox, device changed, mount refused) is logged, left
//     unclaimed, and tried again when its descriptor next changes; the other volumes carry on.
//   - On Stop, or when Run's context ends (crust-microvm run ends it on SIGTERM and SIGINT), each volume
//     is unmounted, detached and released, the VM stopped and the sockets removed: no process and no
//     socket are left; the lock file and the logs stay. A sandbox still booting just stops booting.
//   - If QEMU exits while the sandbox runs (killed, or a guest crash), the sandbox is not restarted: the
//     guest's processes died with the VM, and a fresh VM would hide that from the runtime above. Run logs
//     it, releases every claim and returns ErrVMDied (crust-microvm run exits ExitVMDied).
//   - If crustd ends a claim while the volume is mounted (it took the handler for gone, or an operator
//     forced it), the volume is claimed again (Client.KeepClaims of crust.dev/crust/api/handler) and the claim logged.
//   - If the run process is killed outright, QEMU dies with it (it gets SIGKILL when its parent dies).
//     crustd releases the claims once it notices (its endpoint refuses and the process is gone), and a
//     later run with the same name cleans the stale files and starts afresh.
package vmhandler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	crusthandler "crust.dev/crust/api/handler"
	"crust.dev/crust/examples/microvm/vm"
)

// Defaults of Config.
const (
	// DefaultStateDir is the parent of the sandboxes' state directories.
	DefaultStateDir = "/run/crust-microvm"
	// DefaultAssets is where the guest's kernel and initramfs are looked for (see Config.Assets).
	DefaultAssets = "/usr/share/crust/guest"
)

// Config describes one sandbox.
type Config struct {
	// Name is the name of the sandbox's state directory, which exec and stop take: a letter or digit,
	// then up to 62 letters, digits, '.', '_' or '-'.
	Name string
	// SandboxID is the sandbox id the volumes are claimed for in crustd (a container runtime's sandbox
	// id, such as CRI's 64 hex digits); "" means Name.
	SandboxID string
	// CrustSocket is crustd's socket; "" means crusthandler.DefaultSocket.
	CrustSocket string
	// Volumes are the volumes to claim and mount; guest paths must be distinct. A target given more than
	// once (two containers of the pod using one volume) is one volume at each of its guest paths: one
	// claim, one disk, mounted at the first guest path given and mounted again at the others.
	Volumes []Volume
	// Accel is QEMU's accelerator; "" means vm.AccelAuto.
	Accel vm.Accel
	// StateDir is the parent of the sandbox's state directory; "" means DefaultStateDir.
	StateDir string
	// Assets holds the guest, in the layout hack/guest/fetch-kernel.sh and mkinitramfs write:
	// Assets/cloud/vmlinux and Assets/initramfs-cloud.cpio. "" means DefaultAssets.
	Assets string
	// Log receives the handler's log; nil means slog.Default().
	Log *slog.Logger
}

// Volume is a volume the sandbox uses: the target path it was staged with and where it is mounted in the
// guest.
type Volume struct {
	Target    string
	GuestPath string
}

// ParseVolume parses TARGET:GUEST_PATH (split at the last ':'); both must be clean absolute paths, and the
// guest path not "/".
func ParseVolume(s string) (Volume, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Volume{}, fmt.Errorf("volume %q: want TARGET:GUEST_PATH", s)
	}
	v := Volume{Target: s[:i], GuestPath: s[i+1:]}
	for _, p := range []string{v.Target, v.GuestPath} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return Volume{}, fmt.Errorf("volume %q: %q is not a clean absolute path below /", s, p)
		}
	}
	return v, nil
}

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func checkName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("sandbox name %q: want a letter or digit, then up to 62 letters, digits, '.', '_', '-'", name)
	}
	return nil
}

func (c *Config) setDefaults() error {
	if err := checkName(c.Name); err != nil {
		return err
	}
	if c.SandboxID == "" {
		c.SandboxID = c.Name
	}
	if c.CrustSocket == "" {
		c.CrustSocket = crusthandler.DefaultSocket
	}
	if c.Accel == "" {
		c.Accel = vm.AccelAuto
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.Assets == "" {
		c.Assets = DefaultAssets
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	paths := map[string]bool{}
	for _, v := range c.Volumes {
		if _, err := ParseVolume(v.Target + ":" + v.GuestPath); err != nil {
			return err
		}
		if paths[v.GuestPath] {
			return fmt.Errorf("volume %s:%s: guest path given twice", v.Target, v.GuestPath)
		}
		paths[v.GuestPath] = true
	}
	return nil
}

// ErrVMDied is returned (wrapped) by Run when QEMU exited while the sandbox ran; crust-microvm run then
// exits with ExitVMDied.
var ErrVMDied = errors.New("the VM died")

// teardownTimeout bounds Run's clean-up after it was told to stop.
const teardownTimeout = 2 * time.Minute

// Run runs the sandbox until ctx ends, Stop is called for it or its VM exits, then tears it down (see the
// package documentation). It returns nil after a stop that left everything clean (a stop while booting
// included), and an error when the sandbox could not start, its VM died, or the teardown failed somewhere
// (it still does every other step).
func Run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	log := cfg.Log.With("sandbox", cfg.Name)
	st, err := lockState(cfg.StateDir, cfg.Name, log)
	if err != nil {
		return err
	}
	defer st.unlock()
	crust, err := crusthandler.Dial(cfg.CrustSocket)
	if err != nil {
		return err
	}
	defer func() { _ = crust.Close() }()
	kernel, initrd := filepath.Join(cfg.Assets, "cloud", "vmlinux"), filepath.Join(cfg.Assets, "initramfs-cloud.cpio")
	for _, f := range []string{kernel, initrd} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("guest assets: %w (build them with make guest, or hack/guest/fetch-kernel.sh and examples/microvm/hack/mkinitramfs)", err)
		}
	}

	// The control socket comes first, so that a stop reaches a sandbox that is still booting.
	l, err := listenControl(st.path(controlSocket))
	if err != nil {
		return err
	}
	ctl := newControl()
	waitControl := ctl.serve(l)
	defer func() {
		_ = l.Close()
		ctl.finish(err)
		waitControl(5 * time.Second) // let stop callers have their answer before the process exits
	}()
	// A stop request ends ctx as a signal does.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctl.stopReq:
			cancel()
		case <-ctx.Done():
		}
	}()

	machine, err := vm.Start(ctx, vm.Config{Kernel: kernel, Initramfs: initrd, Accel: cfg.Accel, StateDir: st.dir})
	if err != nil {
		if ctx.Err() != nil {
			log.Info("stopped while booting")
			return nil
		}
		return err
	}
	boot := machine.Boot()
	log.Info("VM up", "accel", boot.Accel, "boot", boot.Took.Round(time.Millisecond), "kernel", boot.Kernel, "fallback", boot.Fallback)
	if err := writeNoFollow(st.path(pidFile), []byte(strconv.Itoa(machine.Pid())+"\n")); err != nil {
		log.Warn("cannot record QEMU's pid", "err", err)
	}
	defer func() { _ = os.Remove(st.path(pidFile)) }()

	s := newSandbox(cfg.SandboxID, crust, machine, cfg.Volumes, log)
	stopHandler, endpoint, err := crusthandler.ServeHandler(st.path(handlerSocket), s)
	if err != nil {
		return errors.Join(err, machine.Stop(context.Background()))
	}
	s.endpoint = endpoint
	ctl.agent.Store(machine.Agent())

	// The volumes are worked on until the teardown starts.
	work, endWork := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, v := range s.volumes() {
		wg.Go(func() { s.keepAttached(work, v) })
	}
	wg.Go(func() { s.watch(work) })
	wg.Go(func() { s.keepClaims(work) })
	log.Info("ready", "handler", endpoint, "volumes", len(s.volumes()))

	var why error
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case <-machine.Done():
		// The guest's processes died with it: a fresh VM would be a sandbox without them, which the
		// runtime above still believes to run. So the sandbox ends, its claims released, and the runtime
		// sees it die and starts it again as it sees fit.
		why = fmt.Errorf("%w: QEMU %s (console log: %s); the volumes' claims were released and the VM was not restarted",
			ErrVMDied, machine.Exit(), machine.ConsoleLog())
		log.Error("QEMU exited under the running sandbox; releasing the volumes' claims and stopping, not restarting the VM",
			"qemu", machine.Exit(), "qemu_pid", machine.Pid(), "console", machine.ConsoleLog())
	}
	_ = l.Close()
	endWork()
	wg.Wait()
	stopHandler() // crustd gets UNAVAILABLE from now on
	tctx, tcancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer tcancel()
	if err := errors.Join(why, s.teardown(tctx)); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}
