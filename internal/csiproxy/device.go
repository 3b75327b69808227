package csiproxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/hostdev"
)

// resolveDevice returns a name under /dev of the block device bind-mounted (or created) at node:
// /dev/block/MAJ:MIN when it resolves to that device, else /dev/<DEVNAME> from
// /sys/dev/block/MAJ:MIN/uevent when that is the device, else node itself.
func resolveDevice(node string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(node, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("%s is not a block device", node)
	}
	maj, mnr := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	same := func(p string) bool {
		var s unix.Stat_t
		return unix.Stat(p, &s) == nil && s.Mode&unix.S_IFMT == unix.S_IFBLK && s.Rdev == st.Rdev
	}
	if p := fmt.Sprintf("/dev/block/%d:%d", maj, mnr); same(p) {
		return p, nil
	}
	if bd, err := (hostdev.Sysfs{}).Block(maj, mnr); err == nil {
		if p := filepath.Join("/dev", bd.Name); same(p) {
			return p, nil
		}
	}
	return node, nil
}

// deviceSize returns a block device's size in bytes.
func deviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, fmt.Errorf("device size: %w", err)
	}
	defer func() { _ = f.Close() }()
	size, err := hostdev.BlockSize(int(f.Fd()))
	if err != nil {
		return 0, fmt.Errorf("device size of %s: %w", dev, err)
	}
	return size, nil
}

// removePrivate removes the private block path and its directory. A path that is still a mount point
// cannot be removed (EBUSY), which is reported.
func removePrivate(private string) error {
	if err := os.Remove(private); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(filepath.Dir(private)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
