package hostdev

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctlGetSize reads a block device's size in bytes (BLKGETSIZE64). x/sys has no typed wrapper for it,
// hence the raw call.
func ioctlGetSize(fd int, size *uint64) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(size)))
	if errno != 0 {
		return errno
	}
	return nil
}
