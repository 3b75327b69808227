package lvmdriver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"crust.dev/crust/examples/lvm-csi/internal/lvm"
	"crust.dev/crust/examples/lvm-csi/lvmtest"
)

// The extent map serves a volume whose extents are not contiguous (it was extended after another volume
// took the next extents) as one device: a filesystem made on it, grown online and read back holds its
// data, and what the device shows is exactly what LVM's extents hold on the physical volume. XFS, because
// it grows online with CAP_SYS_ADMIN alone (ext4 needs CAP_SYS_RESOURCE, which test sandboxes may lack).
func TestExtentMapFragmentedVolume(t *testing.T) {
	vg := lvmtest.New(t, 1<<30)
	r := &lvm.Runner{Devices: []string{vg.Device}, NoActivation: true}
	ctx := context.Background()
	for _, args := range [][]string{
		{"lvcreate", "--yes", "--type", "linear", "-L", "320m", "-n", "a", vg.Name},
		{"lvcreate", "--yes", "--type", "linear", "-L", "8m", "-n", "b", vg.Name},
		{"lvextend", "-L", "400m", vg.Name + "/a"},
	} {
		if _, err := r.Run(ctx, args[0], args[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	lv, err := r.LV(ctx, vg.Name, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(lv.Segments) != 2 {
		t.Fatalf("want a volume of 2 segments, got %+v", lv.Segments)
	}
	// Shrink it back to one segment for the start, so that growing it online is tested too.
	if _, err := r.Run(ctx, "lvreduce", "--yes", "-L", "320m", vg.Name+"/a"); err != nil {
		t.Fatal(err)
	}
	lv, _ = r.LV(ctx, vg.Name, "a")

	m, err := newExtentMap(vg.Name, r, filepath.Join(t.TempDir(), "lv"), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.close(); err != nil {
			t.Error(err)
		}
	}()
	dev, err := m.activate(ctx, lv, true)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.xfs", "-q", dev)
	mnt := t.TempDir()
	run(t, "mount", dev, mnt)
	mounted := true
	defer func() {
		if mounted {
			_ = exec.Command("umount", mnt).Run()
		}
	}()
	if err := m.deactivate(ctx, "a"); err == nil {
		t.Fatal("deactivate succeeded on a mounted volume")
	}

	if _, err := r.Run(ctx, "lvextend", "-L", "400m", vg.Name+"/a"); err != nil {
		t.Fatal(err)
	}
	lv, _ = r.LV(ctx, vg.Name, "a")
	if err := m.refresh(ctx, lv); err != nil {
		t.Fatal(err)
	}
	run(t, "xfs_growfs", mnt)
	data := bytes.Repeat([]byte("crust"), 300<<20/5) // more than the space left in the first segment
	if err := os.WriteFile(filepath.Join(mnt, "f"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "umount", mnt)
	mounted = false
	run(t, "xfs_repair", "-n", dev)
	run(t, "mount", "-o", "ro", dev, mnt)
	mounted = true
	got, err := os.ReadFile(filepath.Join(mnt, "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, err %v", len(got), err)
	}
	run(t, "umount", mnt)
	mounted = false

	// The device's last MiB is the second segment's last MiB on the physical volume.
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tail := make([]byte, 1<<20)
	if _, err := f.ReadAt(tail, 400<<20-1<<20); err != nil {
		t.Fatal(err)
	}
	pv, err := os.Open(vg.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pv.Close() }()
	starts, _ := r.PEStarts(ctx, vg.Name)
	last := lv.Segments[len(lv.Segments)-1]
	want := make([]byte, 1<<20)
	if _, err := pv.ReadAt(want, starts[vg.Device]+last.PE*4<<20+last.Size-1<<20); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if !bytes.Equal(tail, want) {
		t.Fatal("the device's tail differs from the extents on the physical volume")
	}
	_ = f.Close()

	// Extended by another process (the controller's) while active: activating it again shows the new size,
	// as a device-mapper device does once lvextend returns.
	if _, err := r.Run(ctx, "lvextend", "-L", "440m", vg.Name+"/a"); err != nil {
		t.Fatal(err)
	}
	lv, _ = r.LV(ctx, vg.Name, "a")
	if again, err := m.activate(ctx, lv, false); err != nil || again != dev {
		t.Fatalf("activate again: %s, %v; want %s", again, err, dev)
	}
	if size, err := deviceSize(dev); err != nil || size != 440<<20 {
		t.Fatalf("after lvextend and activate, %s is %d bytes (%v), want %d", dev, size, err, 440<<20)
	}
	if err := m.deactivate(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dev); !os.IsNotExist(err) {
		t.Fatalf("%s still there after deactivate: %v", dev, err)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// The FUSE device behind the extent map is never inherited by the driver's children (mkfs, resize2fs, a
// proxy the tests start): a child holding it keeps the connection alive after the driver is gone, and
// every process that then touches a volume's loop device waits for an answer forever.
func TestExtentMapDeviceNotInherited(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount")
	}
	m, err := newExtentMap("vg", &lvm.Runner{}, filepath.Join(t.TempDir(), "lv"), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.close(); err != nil {
			t.Error(err)
		}
	})
	out, err := exec.Command("sh", "-c", "ls -l /proc/$$/fd").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if bytes.Contains(out, []byte("/dev/fuse")) {
		t.Fatalf("a child inherited the FUSE device:\n%s", out)
	}
}
