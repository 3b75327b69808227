package hostdev

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// BlockSize returns the size in bytes of the open block device fd (BLKGETSIZE64): the one place crust's
// programs read it. x/sys has no typed wrapper for this ioctl, hence the raw call.
func BlockSize(fd int) (int64, error) {
	var size uint64
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size)))
	if errno != 0 {
		return 0, errno
	}
	return int64(size), nil
}
