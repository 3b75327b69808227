//go:build linux

package guest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// port is the agent's end of the virtio-serial port. The kernel answers a read with no data (EOF) while
// no host is connected; Read then waits for the SIGIO the kernel sends when the host connects or data
// comes, so that a read blocks until there are bytes, as agentproto.ListenPort wants.
type port struct {
	f    *os.File
	sigs chan os.Signal
}

func openPort(path string) (*port, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	p := &port{f: os.NewFile(uintptr(fd), path), sigs: make(chan os.Signal, 1)}
	signal.Notify(p.sigs, unix.SIGIO)
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETOWN, os.Getpid())
	}
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags|unix.O_ASYNC)
	}
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("asking for SIGIO on %s: %w", path, err)
	}
	return p, nil
}

func (p *port) Read(b []byte) (int, error) {
	for {
		select {
		case <-p.sigs: // a signal from before this read: the read sees what it announced
		default:
		}
		n, err := p.f.Read(b)
		if n > 0 || !errors.Is(err, io.EOF) {
			return n, err
		}
		<-p.sigs
	}
}

// Write blocks while no host is connected (the kernel's doing).
func (p *port) Write(b []byte) (int, error) { return p.f.Write(b) }

func (p *port) Close() error {
	signal.Stop(p.sigs)
	return p.f.Close()
}

// findPort waits up to wait for the virtio-serial port called name and returns its device node. It
// looks again on each kernel uevent (the port's device appears, then its name is set), not on a clock,
// and gives up early when the modules fail to load.
func findPort(name string, wait time.Duration, mods *moduleLoader) (string, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return "", fmt.Errorf("uevent socket: %w", err)
	}
	events := os.NewFile(uintptr(fd), "uevents")
	defer func() { _ = events.Close() }()
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		return "", fmt.Errorf("uevent socket: %w", err)
	}
	_ = events.SetReadDeadline(time.Now().Add(wait))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-mods.done:
			if mods.err != nil {
				_ = events.SetReadDeadline(time.Now()) // wake the read: the port will not come
			}
		case <-stop:
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		if dev, ok := portDevice(name); ok {
			return dev, nil
		}
		if err := mods.failed(); err != nil {
			return "", err
		}
		if _, err := events.Read(buf); err != nil {
			if dev, ok := portDevice(name); ok {
				return dev, nil
			}
			if err := mods.failed(); err != nil {
				return "", err
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return "", fmt.Errorf("no virtio-serial port named %s after %s", name, wait)
			}
			return "", fmt.Errorf("reading uevents: %w", err)
		}
	}
}

// portDevice returns the device node of the virtio-serial port called name, if there is one yet.
func portDevice(name string) (string, bool) {
	return deviceByAttr("/sys/class/virtio-ports/*/name", name)
}

// deviceByAttr returns /dev/NAME for the first sysfs device directory NAME matched by glob's directory
// part whose attribute file (glob's last element) holds want, once its device node exists.
func deviceByAttr(glob, want string) (string, bool) {
	files, _ := filepath.Glob(glob)
	return firstWithAttr(files, want)
}

// firstWithAttr is deviceByAttr over the attribute files files, read in their order.
func firstWithAttr(files []string, want string) (string, bool) {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) != want {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(f))
		if _, err := os.Stat(dev); err == nil {
			return dev, true
		}
	}
	return "", false
}
