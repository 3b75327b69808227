//go:build linux

package guest

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"crust.dev/crust/runtimehooks/microvm/agentproto/agentv1"
)

// Bits fsGroup adds: group and owner read-write on everything, plus search
// and setgid on directories, so that new files inherit the group.
const (
	groupRW   = 0o660
	dirExtra  = 0o110
	setgidBit = unix.S_ISGID
)

// applyFSGroup gives the tree under root the group gid the way Kubernetes
// applies a pod's fsGroup to a volume: every file and directory gets the
// group, owner and group read-write, and directories also search permission
// and the setgid bit; symlinks only get the group. With OnRootMismatch the
// walk is skipped when root already has all of that. The walk stays on
// root's filesystem.
func applyFSGroup(root string, gid int, policy agentv1.FsGroupPolicy) error {
	var rootSt unix.Stat_t
	if err := unix.Lstat(root, &rootSt); err != nil {
		return err
	}
	if policy == agentv1.FsGroupPolicy_FS_GROUP_POLICY_ON_ROOT_MISMATCH && !needsFSGroup(&rootSt, gid) {
		return nil
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
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
			return err
		}
		mode := st.Mode &^ unix.S_IFMT
		want := mode | groupRW
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			want |= dirExtra | setgidBit
		}
		if want != mode {
			if err := unix.Chmod(p, want); err != nil {
				return &fs.PathError{Op: "chmod", Path: p, Err: err}
			}
		}
		return nil
	})
}

// needsFSGroup reports whether root lacks the group, the permissions or the
// setgid bit applyFSGroup gives.
func needsFSGroup(st *unix.Stat_t, gid int) bool {
	if int(st.Gid) != gid {
		return true
	}
	want := uint32(groupRW)
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		want |= dirExtra
		if st.Mode&setgidBit == 0 {
			return true
		}
	}
	return st.Mode&want != want
}
