// Package hostdev makes the host's view of a volume's device current before a runtime grows the guest's.
//
// A CSI driver grows the backing storage in ControllerExpandVolume (lvextend, or a larger image file). A
// logical volume's block device sees the new size at once; a loop device does not until it is told to
// re-read its backing file's size. Refresh does that, and reports the size the host now sees.
//
// Sizes are of the device, or of the file for an image file (VOLUME_TYPE_FILE) or a file-backed
// persistent-memory volume (VOLUME_TYPE_PMEM on a regular file).
//
// It also says what the kernel knows of a block device (Sysfs: its name and kind, and Stack: the
// partitions and device-mapper or md devices built on it) and where the host has it mounted (MountCheck),
// so that crustd hands no sandbox a filesystem the host has mounted.
package hostdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// Size returns the size in bytes of the device at resolvedPath as the host sees it now (of the file, for
// an image file), and changes nothing: a loop device whose backing file grew reports its old size until
// Refresh.
func Size(resolvedPath string, t crustv1.VolumeType) (int64, error) {
	return size(resolvedPath, t, false)
}

// Refresh makes the device at resolvedPath report its backing's current size (for a loop device, the
// equivalent of `losetup -c`) and returns its size in bytes. For an image file (VOLUME_TYPE_FILE) it returns
// the file's size. Refreshing a device whose size did not change changes nothing.
func Refresh(resolvedPath string, t crustv1.VolumeType) (int64, error) {
	return size(resolvedPath, t, true)
}

func size(resolvedPath string, t crustv1.VolumeType, refresh bool) (int64, error) {
	if t == crustv1.VolumeType_VOLUME_TYPE_FILE || t == crustv1.VolumeType_VOLUME_TYPE_PMEM {
		// A persistent-memory volume is a pmem block device or, where allowed, a regular file.
		fi, err := os.Stat(resolvedPath)
		if err != nil {
			return 0, fmt.Errorf("image file %s: %v: %w", resolvedPath, err, errdefs.ErrFailedPrecondition)
		}
		if t == crustv1.VolumeType_VOLUME_TYPE_FILE || fi.Mode().IsRegular() {
			return fi.Size(), nil
		}
	}
	f, err := os.OpenFile(resolvedPath, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("device %s: %v: %w", resolvedPath, err, errdefs.ErrFailedPrecondition)
	}
	defer func() { _ = f.Close() }()
	fd := int(f.Fd())
	if refresh && strings.HasPrefix(filepath.Base(resolvedPath), "loop") {
		if err := unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0); err != nil {
			return 0, fmt.Errorf("refresh the size of loop device %s: %w", resolvedPath, err)
		}
	}
	size, err := BlockSize(fd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", resolvedPath, err)
	}
	return size, nil
}
