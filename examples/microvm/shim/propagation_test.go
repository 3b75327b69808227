package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/testutil"
)

// A container's bind of a node directory into the share, undone, leaves the node's mounts where they are,
// even on a node whose mounts are shared, as kubelet's are: a hostPath "/" mount's submounts (/dev, /sys,
// /proc) unmounted in the share must not be unmounted on the node. Mounts made on the node later still
// show in the share. It runs in a mount namespace of its own, on tmpfs.
func TestShareNeverUnmountsTheNode(t *testing.T) {
	testutil.RequireRoot(t, "to mount")
	dir := t.TempDir()
	errc := make(chan error, 1)
	go func() { errc <- inOwnMountNamespace(func() error { return shareAndUndo(dir) }) }() // its thread dies with it
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// inOwnMountNamespace runs f on a thread that is in a new mount namespace, and never lets the thread run
// anything else (it ends with the goroutine, LockOSThread not undone).
func inOwnMountNamespace(f func() error) error {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return err
	}
	return f()
}

// shareAndUndo plays a shared node under dir: node (a tmpfs with dev mounted in it), binds it into share
// as bindInto does, mounts node/later after, then undoes the share with unmountBelow.
func shareAndUndo(dir string) error {
	node, share := filepath.Join(dir, "node"), filepath.Join(dir, "share")
	for _, d := range []string{node, share} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := unix.Mount("node", node, "tmpfs", 0, ""); err != nil {
		return err
	}
	if err := unix.Mount("", node, "", unix.MS_SHARED, ""); err != nil {
		return err
	}
	for _, d := range []string{"dev", "later"} {
		if err := os.Mkdir(filepath.Join(node, d), 0o700); err != nil {
			return err
		}
	}
	if err := unix.Mount("dev", filepath.Join(node, "dev"), "tmpfs", 0, ""); err != nil {
		return err
	}
	if err := unix.Mount("share", share, "tmpfs", 0, ""); err != nil {
		return err
	}
	if err := unix.Mount("", share, "", unix.MS_SHARED, ""); err != nil {
		return err
	}
	root := filepath.Join(share, "c1", "root")
	if err := bindInto(node, root, false); err != nil {
		return err
	}
	if err := unix.Mount("later", filepath.Join(node, "later"), "tmpfs", 0, ""); err != nil {
		return err
	}
	if ok, err := mountinfo.Mounted(filepath.Join(root, "later")); err != nil || !ok {
		return fmt.Errorf("a mount made on the node after the bind does not show in the share (mounted %v, %v)", ok, err)
	}
	if err := unmountBelow(share); err != nil {
		return err
	}
	var errs []error
	for _, d := range []string{"dev", "later"} {
		if ok, err := mountinfo.Mounted(filepath.Join(node, d)); err != nil || !ok {
			errs = append(errs, fmt.Errorf("the node's %s was unmounted with the share (mounted %v, %v)", d, ok, err))
		}
	}
	return errors.Join(errs...)
}
