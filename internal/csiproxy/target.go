package csiproxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/safedir"
)

// A deferred volume's target is an empty directory on the node that only the runtime's claim gives a
// meaning. kubelet may still make directories in it: for a container's subPath it creates
// <target>/<subPath> on the node (then bind-mounts it under the pod's volume-subpaths), and leaves it
// there at unpublish. Those empty directories are kubelet's and may go with the target. Anything else in
// it (a file, a link, a device, a mount) was written on the node's disk by someone who took the target for
// the volume, a runtime that did not claim it: that is data, and the proxy neither removes it nor hides it
// by unpublishing (it moves it into the quarantine first: see releaseTarget). api/safedir has no removal
// of an empty directory alone (its RemoveAll removes files too), so the walk below works on file
// descriptors itself, as safedir does: never through a link.

// whyMount is what targetData answers of an entry that is a mount point.
const whyMount = "a mount point"

// targetData answers the first entry of the target directory at target that is not kubelet's (anything
// but directories holding nothing but directories, on the target's filesystem, none of them a link) and
// what it is; entry is "" when there is none, or no target. It changes nothing.
func targetData(target string) (entry, what string, err error) {
	return walkTarget(target, false)
}

// clearTarget removes the empty directories in the target directory at target (see targetData), each
// only once empty and never through a link; it never removes anything but an empty directory. It answers
// FailedPrecondition naming the entry and what it is, before removing anything, when the target holds
// something else.
func clearTarget(target string) error {
	entry, what, err := walkTarget(target, false)
	if err == nil && entry == "" {
		entry, what, err = walkTarget(target, true)
	}
	if err != nil {
		return err
	}
	if entry != "" {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s; not unpublishing: move it away, then retry", heldData(target, entry, what))
	}
	return nil
}

// heldData says that the target at target holds entry, which is what, and what that means.
func heldData(target, entry, what string) string {
	return fmt.Sprintf("target path %s holds %s, %s: only the empty directories kubelet makes for a subPath belong in a "+
		"deferred volume's target, so something wrote this on the node's disk (a runtime that did not take the volume)",
		target, entry, what)
}

// walkTarget checks the tree below the directory at target, or with remove removes it (the target itself
// stays), depth first; it answers the first entry that is not kubelet's and what it is (emptyDirs), and
// Internal when the tree cannot be read.
func walkTarget(target string, remove bool) (entry, what string, err error) {
	fd, err := unix.Open(target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return "", "", nil
	}
	if err != nil {
		return "", "", errdefs.Errorf(errdefs.ErrInternal, "open target path %s: %v", target, err)
	}
	d := os.NewFile(uintptr(fd), target)
	defer func() { _ = d.Close() }() // read-only
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", "", errdefs.Errorf(errdefs.ErrInternal, "stat target path %s: %v", target, err)
	}
	entry, what, err = emptyDirs(d, target, st.Dev, remove)
	if err != nil {
		return "", "", errdefs.Errorf(errdefs.ErrInternal, "target path %s: %v", target, err)
	}
	return entry, what, nil
}

// emptyDirs walks the entries of the open directory d, at path p, on device dev, and answers the first
// that is not a directory of dev and what it is instead; with remove, it removes each directory once its
// own entries are gone, with rmdir's semantics (an entry made meanwhile keeps it, and is reported).
func emptyDirs(d *os.File, p string, dev uint64, remove bool) (bad, why string, err error) {
	entries, err := d.ReadDir(-1) // each entry's type as lstat(2) says: a link is a link
	if err != nil {
		return "", "", err
	}
	fd := int(d.Fd())
	for _, e := range entries {
		n, child := e.Name(), filepath.Join(p, e.Name())
		if !e.IsDir() {
			return child, safedir.Kind(e.Type()), nil
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return "", "", &os.PathError{Op: "lstat", Path: child, Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR { // replaced since it was listed
			return child, "an entry that is no longer a directory", nil
		}
		if st.Dev != dev {
			return child, whyMount, nil
		}
		cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", "", &os.PathError{Op: "open", Path: child, Err: err}
		}
		sub := os.NewFile(uintptr(cfd), child)
		bad, why, err = emptyDirs(sub, child, dev, remove)
		_ = sub.Close() // read-only
		if bad != "" || err != nil {
			return bad, why, err
		}
		if remove {
			switch err := unix.Unlinkat(fd, n, unix.AT_REMOVEDIR); {
			case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST):
				return child, "a directory something was made in while it was being removed", nil
			case errors.Is(err, unix.EBUSY):
				return child, whyMount, nil
			case err != nil && !errors.Is(err, unix.ENOENT):
				return "", "", &os.PathError{Op: "remove", Path: child, Err: err}
			}
		}
	}
	return "", "", nil
}
