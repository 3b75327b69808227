//go:build linux

package guest

import (
	"context"
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-mods.done:
			if mods.err != nil {
				cancel() // the port will not come
			}
		case <-ctx.Done():
		}
	}()
	var dev string
	err := onUevents(ctx, wait, "virtio-ports", func(bool) (ok bool, err error) {
		if dev, ok = portDevice(name); ok {
			return true, nil
		}
		return false, mods.failed()
	})
	switch {
	case err == nil:
		return dev, nil
	case errors.Is(err, errWaitPassed):
		return "", fmt.Errorf("no virtio-serial port named %s after %s", name, wait)
	}
	if err := mods.failed(); err != nil {
		return "", err
	}
	return "", err
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
