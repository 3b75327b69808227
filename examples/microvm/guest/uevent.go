//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// errWaitPassed is what onUevents returns when its wait passed and the last look found nothing.
var errWaitPassed = errors.New("wait passed")

// onUevents looks with look now and again after each kernel uevent (a device added, renamed or resized),
// not on a clock, until look reports done or an error, wait has passed, or ctx ends. It listens before the
// first look, so that a change between a look and the wait still wakes it. The look after wait has passed
// is the last (last=true); when that one finds nothing either, onUevents returns errWaitPassed. A burst of
// events the socket could not hold is a wake like any other: the look reads the state, not the events.
func onUevents(ctx context.Context, wait time.Duration, look func(last bool) (done bool, err error)) error {
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
	for last := false; ; {
		done, err := look(last)
		if done || err != nil {
			return err
		}
		if last {
			return errWaitPassed
		}
		_, err = events.Read(buf)
		switch {
		case err == nil, errors.Is(err, unix.ENOBUFS):
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			last = true
		default:
			return fmt.Errorf("reading uevents: %w", err)
		}
	}
}
