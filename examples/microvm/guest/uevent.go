//go:build linux

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// errWaitPassed is what onUevents returns when its wait passed and the last look found nothing.
var errWaitPassed = errors.New("wait passed")

// onUevents looks with look now and again after each kernel uevent of subsystem (a device of it added,
// renamed or resized), not on a clock, until look reports done or an error, wait has passed, or ctx ends.
// It listens before the first look, so that a change between a look and the wait still wakes it; events
// of other subsystems do not wake it, so that the looks do not take the guest's CPU from the hot-plug
// they wait for. The look after wait has passed is the last (last=true); when that one finds nothing
// either, onUevents returns errWaitPassed. A burst of events the socket could not hold is a wake like any
// other: the look reads the state, not the events.
func onUevents(ctx context.Context, wait time.Duration, subsystem string, look func(last bool) (done bool, err error)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return fmt.Errorf("uevent socket: %w", err)
	}
	events := os.NewFile(uintptr(fd), "uevents")
	defer func() { _ = events.Close() }()
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		return fmt.Errorf("uevent socket: %w", err)
	}
	_ = events.SetReadDeadline(time.Now().Add(wait))
	defer context.AfterFunc(ctx, func() { _ = events.SetReadDeadline(time.Now()) })()
	buf := make([]byte, 64<<10)
	// wake reads events until one of subsystem comes (or a burst was dropped): false; or until wait has
	// passed: true.
	wake := func() (passed bool, err error) {
		for {
			n, err := events.Read(buf)
			switch {
			case err == nil && !ofSubsystem(buf[:n], subsystem):
			case err == nil, errors.Is(err, unix.ENOBUFS):
				return false, nil
			case ctx.Err() != nil:
				return false, ctx.Err()
			case errors.Is(err, os.ErrDeadlineExceeded):
				return true, nil
			default:
				return false, fmt.Errorf("reading uevents: %w", err)
			}
		}
	}
	for last := false; ; {
		done, err := look(last)
		if done || err != nil {
			return err
		}
		if last {
			return errWaitPassed
		}
		if last, err = wake(); err != nil {
			return err
		}
	}
}

// ofSubsystem reports whether the uevent msg (ACTION@DEVPATH, then KEY=VALUE fields, each ended by a NUL)
// is of subsystem.
func ofSubsystem(msg []byte, subsystem string) bool {
	want := []byte("SUBSYSTEM=" + subsystem)
	return slices.ContainsFunc(bytes.Split(msg, []byte{0}), func(f []byte) bool { return bytes.Equal(f, want) })
}
