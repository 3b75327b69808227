// Package lvmtest makes a throw-away LVM volume group for tests: a sparse file on a loop device, made a
// physical volume and a volume group of its own, all of it removed at cleanup (logical volumes, volume
// group, physical volume label, loop device, file). It needs root and lvm2 (`make deps` installs it); a
// test run by another user is skipped.
package lvmtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/examples/lvm-csi/internal/lvm"
)

// VG is a volume group on one loop device.
type VG struct {
	// Name is the volume group's name, unique per call (crust-<random>).
	Name string
	// Device is the loop device holding the physical volume, such as /dev/loop3: pass it to the driver's
	// Config.Devices.
	Device string
	// Image is the sparse file behind Device.
	Image  string
	lvm    *lvm.Runner
	lvmDir string // LVM's system directory, beside Image
}

// New makes a volume group of size bytes (rounded down to LVM's 4 MiB extents, less LVM's metadata) in
// t.TempDir() and removes it all at cleanup. It skips t when not run as root and fails it when lvm2 or
// losetup is missing or a step fails.
func New(t testing.TB, size int64) *VG {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices and LVM")
	}
	for _, bin := range []string{"lvm", "losetup"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: install lvm2 and util-linux (make deps)", bin)
		}
	}
	vg, err := Create(t.TempDir(), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := vg.Remove(); err != nil {
			t.Errorf("lvmtest: %v", err)
		}
	})
	return vg
}

// Create makes a volume group of size bytes on a sparse file in dir; Remove undoes it. It is New
// without testing.TB, for runners outside a test.
func Create(dir string, size int64) (*VG, error) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	vg := &VG{Name: "crust-" + hex.EncodeToString(suffix), Image: filepath.Join(dir, "pv.img")}
	f, err := os.Create(vg.Image)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(size)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("losetup", "--find", "--show", vg.Image).CombinedOutput()
	if err != nil {
		_ = os.Remove(vg.Image)
		return nil, fmt.Errorf("losetup: %v: %s", err, out)
	}
	vg.Device = strings.TrimSpace(string(out))
	vg.lvm, vg.lvmDir = &lvm.Runner{Devices: []string{vg.Device}, NoActivation: !lvm.HasDeviceMapper()}, filepath.Join(dir, "lvm")
	if err := vg.lvm.UseSystemDir(vg.lvmDir); err != nil {
		_ = vg.Remove()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := vg.lvm.Run(ctx, "pvcreate", "--yes", vg.Device); err != nil {
		_ = vg.Remove()
		return nil, err
	}
	if _, err := vg.lvm.Run(ctx, "vgcreate", "--yes", vg.Name, vg.Device); err != nil {
		_ = vg.Remove()
		return nil, err
	}
	return vg, nil
}

// LVs returns the names of the logical volumes left in the volume group.
func (vg *VG) LVs() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lvs, err := vg.lvm.LVs(ctx, vg.Name, "")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, lv := range lvs {
		names = append(names, lv.Name)
	}
	return names, nil
}

// Remove removes every logical volume, the volume group, the physical volume label, the loop device, the
// file and LVM's configuration beside it, going on past failures, and returns what failed.
func (vg *VG) Remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if _, err := vg.lvm.Run(ctx, "vgs", "--", vg.Name); err == nil {
		if _, err := vg.lvm.Run(ctx, "vgremove", "--yes", "--force", "--", vg.Name); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := vg.lvm.Run(ctx, "pvs", vg.Device); err == nil {
		if _, err := vg.lvm.Run(ctx, "pvremove", "--yes", "--force", vg.Device); err != nil {
			errs = append(errs, err)
		}
	}
	if vg.Device != "" {
		if out, err := exec.Command("losetup", "-d", vg.Device).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("losetup -d %s: %v: %s", vg.Device, err, out))
		}
	}
	if err := os.Remove(vg.Image); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if vg.lvmDir != "" {
		if err := os.RemoveAll(vg.lvmDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
