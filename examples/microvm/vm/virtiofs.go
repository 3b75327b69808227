package vm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// FSShare is a host directory exported to the guest over virtio-fs: Start runs one virtiofsd per share
// (the C virtiofsd of Debian's qemu-system-common, or Config.VirtioFSD) serving a vhost-user-fs-pci
// device present from boot, and the VM's memory becomes a shared memfd, as vhost-user needs. virtiofsd
// runs as the caller with its default sandbox (namespaces, so root), exits when QEMU disconnects, and is
// killed with the VM. The guest mounts a share with
//
//	mount -t virtiofs TAG DIR
//
// which needs a kernel with virtio-fs (CONFIG_VIRTIO_FS: the virtiofs module, which
// hack/guest/fetch-kernel.sh puts in the generic flavour).
type FSShare struct {
	// Tag is the name the guest mounts it by, as Share.Tag; tags are distinct among Shares and FSShares.
	Tag string
	// Path is the host directory; it must exist.
	Path string
	// Cache is virtiofsd's cache mode ("auto", "always" or "none"); "" means "auto", virtiofsd's default.
	Cache string
	// DaemonArgs are more virtiofsd arguments, such as a runtime's defaults.
	DaemonArgs []string
}

// virtiofsdPaths are where Debian and others install virtiofsd, tried in order after PATH.
var virtiofsdPaths = []string{"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"}

// FindVirtioFSD returns the path of virtiofsd: from PATH, else where distributions install it (Debian's
// qemu-system-common: /usr/lib/qemu/virtiofsd).
func FindVirtioFSD() (string, error) {
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p, nil
	}
	for _, p := range virtiofsdPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("vm: virtiofsd not found in PATH nor at %v (Debian package qemu-system-common)", virtiofsdPaths)
}

// checkFSShares validates the virtio-fs shares against each other and the 9p shares, makes their paths
// absolute (in a copy) and finds virtiofsd when there are any.
func (c *Config) checkFSShares() error {
	if len(c.FSShares) == 0 {
		return nil
	}
	tags := map[string]bool{}
	for _, sh := range c.Shares {
		tags[sh.Tag] = true
	}
	shares := make([]FSShare, 0, len(c.FSShares))
	for _, sh := range c.FSShares {
		abs, err := checkShare(tags, sh.Tag, sh.Path)
		if err != nil {
			return err
		}
		switch sh.Cache {
		case "":
			sh.Cache = "auto"
		case "auto", "always", "none":
		default:
			return fmt.Errorf("vm: virtio-fs share %s: unknown cache mode %q (auto, always, none)", sh.Tag, sh.Cache)
		}
		sh.Path = abs
		sh.DaemonArgs = append([]string(nil), sh.DaemonArgs...)
		shares = append(shares, sh)
	}
	c.FSShares = shares
	if c.VirtioFSD == "" {
		p, err := FindVirtioFSD()
		if err != nil {
			return err
		}
		c.VirtioFSD = p
	}
	return nil
}

// Names of the QEMU objects of the virtio-fs shares and the guest's shared memory.
const (
	fsSharedMem   = "crust-ram"
	vfsChardev    = "crust-vfs"
	vfsDevice     = "crust-vfsdev"
	vfsSocketName = "vfs%d.sock"
	vfsLogName    = "virtiofsd-%d.log"
)

// fsShareArgs are QEMU's arguments for the virtio-fs shares: the guest's RAM as a shared memfd (vhost-user
// daemons map it) on the one NUMA node, and a socket chardev and vhost-user-fs-pci device per share. The
// queue size is Kata's default (virtio_fs_queue_size = 1024).
func (c *Config) fsShareArgs() []string {
	if len(c.FSShares) == 0 {
		return nil
	}
	args := []string{
		"-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=on", fsSharedMem, c.MemoryMB),
		"-numa", "node,memdev=" + fsSharedMem,
	}
	for i, sh := range c.FSShares {
		args = append(args,
			"-chardev", fmt.Sprintf("socket,id=%s%d,path=%s", vfsChardev, i, qemuPath(c.path(fmt.Sprintf(vfsSocketName, i)))),
			"-device", fmt.Sprintf("vhost-user-fs-pci,id=%s%d,chardev=%s%d,tag=%s,queue-size=1024", vfsDevice, i, vfsChardev, i, sh.Tag))
	}
	return args
}

// virtiofsdArgs are virtiofsd's arguments for share i.
func (c *Config) virtiofsdArgs(i int) []string {
	sh := c.FSShares[i]
	args := []string{
		"--socket-path=" + c.path(fmt.Sprintf(vfsSocketName, i)),
		"-o", "source=" + sh.Path,
		"-o", "cache=" + sh.Cache,
	}
	return append(args, sh.DaemonArgs...)
}

// fsDaemon is a running virtiofsd.
type fsDaemon struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
}

// startFSDaemons starts a virtiofsd per share and returns once each listens on its socket (QEMU connects
// to it at start), or with an error after stopping those it started.
func startFSDaemons(cfg *Config, timeout time.Duration) ([]*fsDaemon, error) {
	var ds []*fsDaemon
	fail := func(err error) ([]*fsDaemon, error) {
		stopFSDaemons(ds)
		return nil, err
	}
	for i := range cfg.FSShares {
		sock := cfg.path(fmt.Sprintf(vfsSocketName, i))
		_ = os.Remove(sock)
		logf, err := os.OpenFile(cfg.path(fmt.Sprintf(vfsLogName, i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return fail(fmt.Errorf("vm: virtiofsd log: %w", err))
		}
		d := &fsDaemon{cmd: exec.Command(cfg.VirtioFSD, cfg.virtiofsdArgs(i)...), done: make(chan struct{})}
		d.cmd.Stdout, d.cmd.Stderr = logf, logf
		// As QEMU: it dies with the process that started it, in its own process group.
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := d.cmd.Start(); err != nil {
			_ = logf.Close()
			return fail(fmt.Errorf("vm: starting %s for share %s: %w", cfg.VirtioFSD, cfg.FSShares[i].Tag, err))
		}
		go func() {
			_ = d.cmd.Wait()
			_ = logf.Close()
			close(d.done)
		}()
		ds = append(ds, d)
		if err := waitSocket(sock, d.done, timeout); err != nil {
			log, _ := os.ReadFile(cfg.path(fmt.Sprintf(vfsLogName, i)))
			return fail(fmt.Errorf("vm: virtiofsd for share %s: %w\n%s", cfg.FSShares[i].Tag, err, log))
		}
	}
	return ds, nil
}

// waitSocket waits until path is a socket, the process whose exit closes exited has exited, or timeout
// has passed.
func waitSocket(path string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before listening on " + path)
		case <-deadline:
			return fmt.Errorf("not listening on %s after %s", path, timeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stopFSDaemons kills the daemons still running and waits for all of them to exit.
func stopFSDaemons(ds []*fsDaemon) {
	for _, d := range ds {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Kill()
		}
		<-d.done
	}
}
