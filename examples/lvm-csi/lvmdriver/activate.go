package lvmdriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/lvm-csi/internal/lvm"
)

// Activation says how a logical volume becomes a block device.
type Activation string

const (
	// ActivationAuto picks ActivationDeviceMapper when the kernel has device-mapper, ActivationExtentMap
	// otherwise.
	ActivationAuto Activation = ""
	// ActivationDeviceMapper is LVM's own activation: the volume is a device-mapper device, /dev/<vg>/<lv>.
	ActivationDeviceMapper Activation = "device-mapper"
	// ActivationExtentMap is for kernels without device-mapper (such as the test machines' kernel): LVM
	// keeps the metadata and the driver serves each volume's extents, read from LVM's segment map, as a
	// file on a private FUSE mount and attaches that file to a loop device; /dev/<vg>/<lv> is a symlink to
	// it. The devices live as long as the driver.
	ActivationExtentMap Activation = "extent-map"
)

// errInUse: a device is open (mounted, or held by another exclusive opener).
var errInUse = errors.New("device is in use")

// activator makes logical volumes into block devices.
type activator interface {
	// activate makes lv's device exist (a no-op when it does) and returns its path, /dev/<vg>/<lv>.
	// fresh says the volume was just created: its first and last MiB are zeroed when LVM could not.
	activate(ctx context.Context, lv *lvm.LV, fresh bool) (string, error)
	// refresh makes the device show lv's current size.
	refresh(ctx context.Context, lv *lvm.LV) error
	// deactivate removes the device, or fails with errInUse while it is open. A volume that is not
	// active is not an error.
	deactivate(ctx context.Context, name string) error
	// close releases what the activator holds; devices of ActivationExtentMap go away.
	close() error
}

// deviceMapper is LVM's activation.
type deviceMapper struct {
	vg  string
	lvm *lvm.Runner
}

func (a *deviceMapper) path(name string) string { return filepath.Join("/dev", a.vg, name) }

func (a *deviceMapper) activate(ctx context.Context, lv *lvm.LV, _ bool) (string, error) {
	if _, err := a.lvm.Run(ctx, "lvchange", "--activate", "y", "--", a.vg+"/"+lv.Name); err != nil {
		return "", err
	}
	return a.path(lv.Name), nil
}

func (a *deviceMapper) refresh(ctx context.Context, lv *lvm.LV) error {
	_, err := a.lvm.Run(ctx, "lvchange", "--refresh", "--", a.vg+"/"+lv.Name)
	return err
}

func (a *deviceMapper) deactivate(ctx context.Context, name string) error {
	if err := exclusiveProbe(a.path(name)); err != nil {
		return err
	}
	_, err := a.lvm.Run(ctx, "lvchange", "--activate", "n", "--", a.vg+"/"+name)
	if errors.Is(err, lvm.ErrInUse) {
		return fmt.Errorf("%s: %w", a.path(name), errInUse)
	}
	return err
}

func (a *deviceMapper) close() error { return nil }

// exclusiveProbe fails with errInUse when path is a block device that is open for exclusive use (a
// mounted filesystem holds its device so). A missing path is not an error.
func exclusiveProbe(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		return unix.Close(fd)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s: %w", path, errInUse)
	case errors.Is(err, os.ErrNotExist):
		return nil
	}
	return fmt.Errorf("open %s: %w", path, err)
}
