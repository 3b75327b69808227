package testutil

import (
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// ReadDevice returns the whole of the block device (or file) at path as its medium holds it now: the
// host's cached pages of a device are dropped first (BLKFLSBUF), since a guest that wrote it through
// QEMU bypassed them.
func ReadDevice(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if st, err := f.Stat(); err == nil && st.Mode()&os.ModeDevice != 0 {
		if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
			t.Fatalf("flush the buffers of %s: %v", path, err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
