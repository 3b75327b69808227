//go:build linux

package volume

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// FilesystemBytes reads what mkfs and resize2fs wrote: the size the filesystem has, not the disk's.
func TestFilesystemBytes(t *testing.T) {
	const mib = 1 << 20
	img := func(size int64, mkfs ...string) string {
		t.Helper()
		if _, err := exec.LookPath(mkfs[0]); err != nil {
			t.Skipf("%s: %v", mkfs[0], err)
		}
		p := filepath.Join(t.TempDir(), "disk.img")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(mkfs[0], append(mkfs[1:], p)...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", mkfs[0], err, out)
		}
		return p
	}
	for _, tc := range []struct {
		name   string
		fsType string
		size   int64
		mkfs   []string
		block  uint64
	}{
		{"ext4 4k blocks", "ext4", 64 * mib, []string{"mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-O", "^64bit"}, 4096},
		{"ext4 64bit", "ext4", 64 * mib, []string{"mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-O", "64bit"}, 4096},
		{"ext4 1k blocks", "ext4", 32 * mib, []string{"mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024"}, 1024},
		{"ext3", "ext3", 32 * mib, []string{"mke2fs", "-q", "-F", "-t", "ext3"}, 1024},
		{"xfs", "xfs", 320 * mib, []string{"mkfs.xfs", "-q", "-f"}, 4096},
	} {
		p := img(tc.size, tc.mkfs...)
		size, block, err := FilesystemBytes(p, tc.fsType)
		if err != nil || size != uint64(tc.size) || block != tc.block {
			t.Errorf("%s: %d bytes in blocks of %d (%v); want %d in %d", tc.name, size, block, err, tc.size, tc.block)
		}
		// The disk grows; the filesystem does not until it is grown.
		if err := os.Truncate(p, 2*tc.size); err != nil {
			t.Fatal(err)
		}
		if size, _, err := FilesystemBytes(p, tc.fsType); err != nil || size != uint64(tc.size) {
			t.Errorf("%s on a grown disk: %d (%v); want still %d", tc.name, size, err, tc.size)
		}
		if tc.fsType != "xfs" {
			if out, err := exec.Command("resize2fs", p).CombinedOutput(); err != nil {
				t.Fatalf("resize2fs: %v\n%s", err, out)
			}
			if size, _, err := FilesystemBytes(p, tc.fsType); err != nil || size != uint64(2*tc.size) {
				t.Errorf("%s after resize2fs: %d (%v); want %d", tc.name, size, err, 2*tc.size)
			}
		}
		other := "xfs"
		if tc.fsType == "xfs" {
			other = "ext4"
		}
		if _, _, err := FilesystemBytes(p, other); err == nil {
			t.Errorf("%s read as %s", tc.name, other)
		}
	}
	blank := filepath.Join(t.TempDir(), "blank")
	if err := os.WriteFile(blank, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, fs := range []string{"ext4", "xfs", "btrfs"} {
		if _, _, err := FilesystemBytes(blank, fs); err == nil {
			t.Errorf("a blank disk read as %s", fs)
		}
	}
}

// A superblock read from arbitrary bytes never panics, and a size it reports is its blocks times its
// block size.
func FuzzSuperblockBytes(f *testing.F) {
	ext := make([]byte, 2048)
	ext[1024+0x38], ext[1024+0x39] = 0x53, 0xEF
	ext[1024+0x4] = 16
	f.Add(ext, "ext4")
	xfs := []byte("XFSB\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x01\x00")
	f.Add(xfs, "xfs")
	f.Add([]byte{}, "ext3")
	f.Fuzz(func(t *testing.T, data []byte, fsType string) {
		size, block, err := superblockBytes(bytes.NewReader(data), fsType)
		if err == nil && (block == 0 && size != 0 || block != 0 && size%block != 0) {
			t.Errorf("%s: size %d is not a whole number of %d-byte blocks", fsType, size, block)
		}
	})
}
