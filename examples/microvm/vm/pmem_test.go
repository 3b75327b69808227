package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/internal/disktest"
	"crust.dev/crust/internal/testutil/harness"
)

// statxDAX is STATX_ATTR_DAX: the file's data is accessed directly in (persistent) memory.
const statxDAX = 0x00200000

// guestStatxAttributes returns a file's statx attributes in the guest, read with xfs_io.
func guestStatxAttributes(t *testing.T, v *VM, path string) uint64 {
	t.Helper()
	return harness.StatxAttributes(t, execOK(t, v, "xfs_io", "-r", "-c", "statx -r", path))
}

// pmemFile makes a sparse file of size bytes and, unless fsType is "", a filesystem on it made on the host
// (ext4 with 4 KiB blocks, as DAX needs) holding seed.
func pmemFile(t *testing.T, size int64, fsType, seed string) string {
	t.Helper()
	if fsType == "" {
		return disktest.Image(t, size)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "seed"), []byte(seed), 0o644); err != nil {
		t.Fatal(err)
	}
	return disktest.Image(t, size, "mkfs.ext4", "-q", "-b", "4096", "-d", src)
}

// TestPmemInGuest hot-plugs file-backed persistent memory into one TCG guest as virtio-pmem and checks:
// the guest finds the device by its address and mounts it with DAX in effect (the mount says dax, and
// statx says a file written there is DAX); data synced in the guest is in the host's file; a read-only one
// is mounted read-only; a block device works as a file does; a blank one is formatted for DAX; ext4 with 1 KiB blocks is refused saying why; a repeated attach is the same device; a size
// that is no multiple of 2 MiB is refused, naming the file.
func TestPmemInGuest(t *testing.T) {
	v := startVM(t, Config{Accel: AccelTCG})
	ctx := context.Background()
	rw := pmemFile(t, 64<<20, "ext4", "from the host\n")
	p, err := v.AttachPmem(ctx, "vol-rw", rw, false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Address == 0 || p.Size != 64<<20 || p.Persistent {
		t.Errorf("attached %+v: want an address, 64 MiB, and not persistent on the host (a file on a disk)", p)
	}
	if again, err := v.AttachPmem(ctx, "vol-rw", rw, false); err != nil || again != p {
		t.Errorf("attach again: %+v, %v; want %+v", again, err, p)
	}
	res, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "vol-rw", PmemAddress: p.Address, FsType: "ext4", Target: "/data/pmem"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Device, "/dev/pmem") {
		t.Errorf("mounted from %s, want a /dev/pmemN", res.Device)
	}
	if opts := execOK(t, v, "awk", `$2 == "/data/pmem" {print $4}`, "/proc/mounts"); !strings.Contains(opts, "dax") {
		t.Errorf("the mount's options %q do not say dax", opts)
	}
	if got := execOK(t, v, "cat", "/data/pmem/seed"); got != "from the host" {
		t.Errorf("seed = %q", got)
	}
	data := bytes.Repeat([]byte("persistent "), 1000)
	execOK(t, v, "sh", "-c", "printf '%s' \"$0\" > /data/pmem/out && sync /data/pmem/out", string(data))
	if attrs := guestStatxAttributes(t, v, "/data/pmem/out"); attrs&statxDAX == 0 {
		t.Errorf("statx attributes of a file on the pmem volume are %#x: no STATX_ATTR_DAX", attrs)
	}
	if _, err := v.Agent().Unmount(ctx, &agentv1.UnmountRequest{Target: "/data/pmem"}); err != nil {
		t.Fatal(err)
	}
	if got := hostDebugfsCat(t, rw, "/out"); !bytes.Equal(got, data) {
		t.Errorf("the host reads %d bytes of /out from the backing file, want the %d written in the guest", len(got), len(data))
	}

	ro := pmemFile(t, 32<<20, "ext4", "read only\n")
	q, err := v.AttachPmem(ctx, "vol-ro", ro, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "vol-ro", PmemAddress: q.Address, FsType: "ext4", ReadOnly: true, Target: "/data/ro"}); err != nil {
		t.Fatal(err)
	}
	if got := execOK(t, v, "cat", "/data/ro/seed"); got != "read only" {
		t.Errorf("read-only seed = %q", got)
	}
	if res, err := v.Agent().Exec(ctx, &agentv1.ExecRequest{Argv: []string{"touch", "/data/ro/x"}}); err != nil || res.ExitStatus == 0 {
		t.Errorf("touch on the read-only pmem volume: %+v, %v; want a failure", res, err)
	}

	// A block device as the backing, as a /dev/pmemN would be (a loop device here).
	dev := loopDevice(t, 32<<20, "mkfs.ext4", "-q", "-b", "4096")
	r, err := v.AttachPmem(ctx, "vol-blk", dev.path, false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size != 32<<20 {
		t.Errorf("the block device's size is %d, want 32 MiB", r.Size)
	}
	if _, err := v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "vol-blk", PmemAddress: r.Address, FsType: "ext4", Target: "/data/blk"}); err != nil {
		t.Fatal(err)
	}
	execOK(t, v, "sh", "-c", "echo on a block device > /data/blk/out && sync /data/blk/out")
	if attrs := guestStatxAttributes(t, v, "/data/blk/out"); attrs&statxDAX == 0 {
		t.Errorf("statx attributes of a file on the block-device-backed pmem volume are %#x: no STATX_ATTR_DAX", attrs)
	}
	if _, err := v.Agent().Unmount(ctx, &agentv1.UnmountRequest{Target: "/data/blk"}); err != nil {
		t.Fatal(err)
	}
	if got := string(hostDebugfsCat(t, dev.path, "/out")); got != "on a block device\n" {
		t.Errorf("the host reads %q from the loop device", got)
	}

	// A blank one formatted in the guest gets the 4 KiB blocks DAX needs (mke2fs would choose 1 KiB here).
	blank := pmemFile(t, 16<<20, "", "")
	bp, err := v.AttachPmem(ctx, "vol-blank", blank, false)
	if err != nil {
		t.Fatal(err)
	}
	res, err = v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "vol-blank", PmemAddress: bp.Address, FsType: "ext4",
		CreateFilesystem: true, Target: "/data/blank"})
	if err != nil || !res.Formatted {
		t.Fatalf("mount of a blank pmem volume with create_filesystem: %+v, %v", res, err)
	}
	if opts := execOK(t, v, "awk", `$2 == "/data/blank" {print $4}`, "/proc/mounts"); !strings.Contains(opts, "dax") {
		t.Errorf("the pmem volume formatted in the guest is mounted %q, without dax", opts)
	}

	// ext4 with 1 KiB blocks cannot be mounted with DAX, and the agent says why.
	small := pmemFile(t, 16<<20, "", "")
	harness.Run(t, "mkfs.ext4", "-q", "-b", "1024", small)
	sp, err := v.AttachPmem(ctx, "vol-1k", small, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Agent().Mount(ctx, &agentv1.MountRequest{Serial: "vol-1k", PmemAddress: sp.Address, FsType: "ext4", Target: "/data/1k"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "1024-byte blocks") ||
		!strings.Contains(err.Error(), "mkfs.ext4 -b 4096") {
		t.Errorf("mount of ext4 with 1 KiB blocks with DAX: %v; want FAILED_PRECONDITION saying why", err)
	}

	odd := pmemFile(t, 3<<20, "", "")
	if _, err := v.AttachPmem(ctx, "vol-odd", odd, false); err == nil || !strings.Contains(err.Error(), odd) || !strings.Contains(err.Error(), "2 MiB") {
		t.Errorf("a 3 MiB backing: %v; want a refusal naming %s and 2 MiB", err, odd)
	}
	if n := len(v.Pmems()); n != 5 {
		t.Errorf("%d persistent-memory devices in the VM, want 5", n)
	}
}

// hostDebugfsCat reads a file from an ext4 image on the host without mounting it.
func hostDebugfsCat(t *testing.T, image, path string) []byte {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+path, image).Output()
	if err != nil {
		t.Fatalf("debugfs cat %s %s: %v", image, path, err)
	}
	return out
}
