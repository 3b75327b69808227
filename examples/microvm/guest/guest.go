//go:build linux

// Package guest is crust-guest, the agent that runs as PID 1 (/init) in the
// crust microVM. It sets up the guest's base filesystems, loads the kernel
// modules listed in agentproto.ModuleList, finds the virtio-serial port named
// agentproto.PortName and serves the agent's API (AgentService, over ttrpc) on
// it for as long as the VM runs: mounting hot-plugged disks, measuring and growing their
// filesystems, running commands, powering off.
//
// Its log goes to the kernel console (the VM's serial port). It must be built
// static (CGO_ENABLED=0): the guest has no C library for it. Child processes
// are started only through procTable, never os/exec, because PID 1 reaps
// every exited child.
package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// portWait bounds the wait for the agent's virtio-serial port at boot.
const portWait = 30 * time.Second

var logger = log.New(os.Stderr, "crust-guest: ", log.Lmicroseconds)

// Run sets the guest up and serves AgentService; it returns only when the
// setup fails or the port does. The caller then calls PowerOff.
func Run() error {
	start := time.Now()
	if os.Getpid() != 1 {
		return errors.New("crust-guest runs as PID 1 (/init) in the crust VM")
	}
	if err := mountBase(); err != nil {
		return err
	}
	os.Clearenv()
	_ = os.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	_ = os.Setenv("HOME", "/")
	// The modules load in the background: the port appears as soon as
	// virtio_console is in, and filesystem modules (xfs) may come later;
	// operations on disks wait for all of them.
	mods := &moduleLoader{done: make(chan struct{})}
	go mods.load()
	procs := newProcTable()
	go procs.reap()

	path, err := findPort(agentproto.PortName, portWait, mods)
	if err != nil {
		return err
	}
	p, err := openPort(path)
	if err != nil {
		return err
	}
	l := agentproto.ListenPort(p)
	srv, err := agentproto.NewServer()
	if err != nil {
		return err
	}
	agentv1.RegisterAgentServiceService(srv, newAgent(start, procs, mods))
	logger.Printf("serving on %s (%s) %.2fs after start", path, agentproto.PortName, time.Since(start).Seconds())
	err = srv.Serve(context.Background(), l)
	return fmt.Errorf("serving on %s: %w", path, err)
}

// mountBase mounts /dev first (the initramfs has no device nodes, so the
// console is opened only then), then /proc, /sys, /dev/pts, /tmp and /run.
func mountBase() error {
	if err := mountFS("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return err
	}
	if c, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := range 3 {
			_ = unix.Dup3(int(c.Fd()), fd, 0)
		}
		_ = c.Close()
	}
	for _, m := range []struct {
		src, target, fstype string
		flags               uintptr
		data                string
	}{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		// Terminals of containers without a devpts of their own come from here.
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	} {
		if err := mountFS(m.src, m.target, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	return nil
}

func mountFS(src, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, target, fstype, flags, data); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mounting %s on %s: %w", fstype, target, err)
	}
	return nil
}

// moduleLoader loads the modules of agentproto.ModuleList in order, once.
type moduleLoader struct {
	done chan struct{} // closed when loading ended
	err  error         // why it failed, readable after done
}

func (m *moduleLoader) load() {
	m.err = loadModules()
	if m.err != nil {
		logger.Printf("%v", m.err)
	}
	close(m.done)
}

// wait waits for the loading to end and returns its error.
func (m *moduleLoader) wait(ctx context.Context) error {
	select {
	case <-m.done:
		if m.err != nil {
			return fmt.Errorf("loading the kernel modules: %w", m.err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// over reports whether loading has ended, in success or in an error.
func (m *moduleLoader) over() bool { return isClosed(m.done) }

// isClosed reports whether ch is closed (or has a value ready).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// failed returns the error loading has ended in, or nil while it goes on or when it succeeded.
func (m *moduleLoader) failed() error {
	if m.over() {
		return m.err
	}
	return nil
}

// loadModules loads the modules of agentproto.ModuleList in order. A module
// already loaded is fine; one that fails (crc32c-intel on a CPU without
// SSE4.2 answers ENODEV, say) is logged and skipped: what needed it fails
// later with its own error. Only an unreadable list is an error.
func loadModules() error {
	list, err := os.Open(agentproto.ModuleList)
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	defer func() { _ = list.Close() }()
	sc := bufio.NewScanner(list)
	var loaded []string
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		if err := loadModule(filepath.Join(agentproto.ModulesDir, name)); err != nil {
			logger.Printf("%v (skipped)", err)
			continue
		}
		loaded = append(loaded, strings.TrimSuffix(name, ".ko"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	logger.Printf("loaded modules %s", strings.Join(loaded, " "))
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("module: %w", err)
	}
	defer func() { _ = f.Close() }()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading module %s: %w", filepath.Base(path), err)
	}
	return nil
}

// PowerOff syncs and powers the VM off. It does not return unless the
// kernel refuses, in which case it sleeps forever: PID 1 must not exit.
func PowerOff() {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		logger.Printf("power off: %v", err)
	}
	for {
		time.Sleep(time.Hour)
	}
}
