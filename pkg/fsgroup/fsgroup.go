//go:build linux

// Package fsgroup applies a pod's fsGroup to a volume's filesystem, the way kubelet does: every file and
// directory gets the group, owner and group read and write; directories also get search permission for
// owner and group and the setgid bit, so that new files inherit the group; symbolic links only get the
// group, and are never followed. It is public because both sides of crust apply fsGroup: a CSI driver
// that mounts on the host (and crust's CSI proxy) and a runtime handler that mounts in its guest.
//
// Apply is idempotent: a second call changes nothing. It stays on root's filesystem: a mount below root
// is not walked.
package fsgroup

import (
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Bits Apply adds.
const (
	groupRW  = 0o660        // owner and group read and write, on everything
	dirExtra = 0o110        // owner and group search, on directories
	setgid   = unix.S_ISGID // on directories, so that new files inherit the group
	typeMask = unix.S_IFMT  // the file type bits of a stat mode
	dirType  = unix.S_IFDIR // a directory's type bits
	permMask = ^uint32(typeMask)
)

// Policy says when Apply walks the tree.
type Policy int

const (
	// Always walks the whole tree.
	Always Policy = iota
	// OnRootMismatch walks only when root itself lacks the group, the permissions or the setgid bit
	// (Kubernetes' fsGroupChangePolicy OnRootMismatch): a tree applied once is not walked again.
	OnRootMismatch
)

// Apply gives the tree under root the group gid as the package documentation describes, under policy.
// It returns the first error, as a *fs.PathError naming the file.
func Apply(root string, gid int, policy Policy) error {
	var rootSt unix.Stat_t
	if err := unix.Lstat(root, &rootSt); err != nil {
		return &fs.PathError{Op: "lstat", Path: root, Err: err}
	}
	if policy == OnRootMismatch && !needs(&rootSt, gid) {
		return nil
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Dev != rootSt.Dev {
			return filepath.SkipDir // another mount below the volume
		}
		if int(st.Gid) != gid {
			if err := os.Lchown(p, -1, gid); err != nil {
				return err
			}
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if err := unix.Lstat(p, &st); err != nil { // chown may have cleared setuid/setgid
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		mode := st.Mode & permMask
		want := mode | groupRW
		if st.Mode&typeMask == dirType {
			want |= dirExtra | setgid
		}
		if want != mode {
			if err := unix.Chmod(p, want); err != nil {
				return &fs.PathError{Op: "chmod", Path: p, Err: err}
			}
		}
		return nil
	})
}

// needs reports whether root (its stat st) lacks the group, the permissions or the setgid bit Apply gives.
func needs(st *unix.Stat_t, gid int) bool {
	if int(st.Gid) != gid {
		return true
	}
	want := uint32(groupRW)
	if st.Mode&typeMask == dirType {
		want |= dirExtra
		if st.Mode&setgid == 0 {
			return true
		}
	}
	return st.Mode&want != want
}
