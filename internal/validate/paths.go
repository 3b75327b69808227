package validate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev"
)

const (
	maxPathLen = 4096 // PATH_MAX
	maxNameLen = 255  // NAME_MAX
)

// pathString checks what can be checked of a target path without the file system: present, at most
// maxPathLen bytes, valid UTF-8 without NUL or control characters, absolute, clean, and no component
// longer than maxNameLen.
func pathString(field, p string) error {
	if err := absPathString(field, p); err != nil {
		return err
	}
	if c := filepath.Clean(p); c != p {
		return errdefs.Field(field, "%q is not clean (it would be %q)", p, c)
	}
	for _, c := range strings.Split(p[1:], "/") {
		if len(c) > maxNameLen {
			return errdefs.Field(field, "has a component of %d bytes; at most %d", len(c), maxNameLen)
		}
	}
	return nil
}

// absPathString is pathString without the cleanliness and component rules (for backing paths, which
// are resolved anyway).
func absPathString(field, p string) error {
	if err := required(field, p, maxPathLen); err != nil {
		return err
	}
	if strings.IndexByte(p, 0) >= 0 {
		return errdefs.Field(field, "contains a NUL byte")
	}
	if err := printable(field, p); err != nil {
		return err
	}
	if !filepath.IsAbs(p) {
		return errdefs.Field(field, "%q is not absolute", p)
	}
	return nil
}

// under returns p relative to the kubelet root when p is a clean path strictly under it.
func (v *Validator) under(p string) (rel string, ok bool) {
	rel, ok = strings.CutPrefix(p, v.root+"/")
	return rel, ok && rel != ""
}

// TargetName checks a target path that names a descriptor to look up: TargetPath's string rules and that
// it lies strictly under the kubelet root, without touching the filesystem. That is all a lookup needs:
// the path of every descriptor held was checked whole (TargetPath) when it was staged, and a name that
// passes here but names nothing held is simply not found. A refusal is a *errdefs.FieldError naming
// field.
func (v *Validator) TargetName(field, p string) error {
	if err := pathString(field, p); err != nil {
		return err
	}
	if _, ok := v.under(p); !ok {
		return v.notUnder(field, p)
	}
	return nil
}

// notUnder is the refusal of a path p that does not lie strictly under the kubelet root.
func (v *Validator) notUnder(field, p string) error {
	if p == v.root {
		return errdefs.Field(field, "%q is the kubelet root itself; a target path lies below it", p)
	}
	if v.realRoot != v.root && (p == v.realRoot || strings.HasPrefix(p, v.realRoot+"/")) {
		return errdefs.Field(field, "%q is not under the kubelet root %s (it is under %s, which the kubelet "+
			"root resolves to; name target paths under %s)", p, v.root, v.realRoot, v.root)
	}
	return errdefs.Field(field, "%q is not under the kubelet root %s", p, v.root)
}

// TargetPath checks a volume target path: it is non-empty, at most 4096 bytes, valid UTF-8 without NUL
// or control characters, absolute, clean (filepath.Clean leaves it unchanged), strictly under the
// kubelet root in its configured form, and no component below the kubelet root is a symlink, or (except
// the last) something other than a directory. Components that do not exist yet are accepted. A refusal
// is a *errdefs.FieldError naming field.
func (v *Validator) TargetPath(field, p string) error {
	if err := pathString(field, p); err != nil {
		return err
	}
	rel, ok := v.under(p)
	if !ok {
		return v.notUnder(field, p)
	}

	if clearPath(v.realRoot + "/" + rel) {
		return nil
	}
	comps := strings.Split(rel, "/")
	onDisk, shown := v.realRoot, v.root
	for i, c := range comps {
		onDisk, shown = onDisk+"/"+c, shown+"/"+c
		fi, err := os.Lstat(onDisk)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil // nothing below can exist either
		case err != nil:
			return errdefs.Field(field, "%s cannot be checked: %v", shown, unwrapPathError(err))
		case fi.Mode()&fs.ModeSymlink != 0:
			return errdefs.Field(field, "%s is a symlink; a target path must not contain symlinks", shown)
		case i < len(comps)-1 && !fi.IsDir():
			return errdefs.Field(field, "%s is not a directory", shown)
		}
	}
	return nil
}

// clearPath reports whether, as path is now, no component of it is a symlink and every component that
// another follows is a directory, components that do not exist included (the walk stops at the first one
// missing), in one system call: openat2 with RESOLVE_NO_SYMLINKS fails with ELOOP at the first link and
// ENOTDIR at a non-directory before it reaches a missing component. False says nothing more: TargetPath
// then looks at each component to name the one that is wrong.
func clearPath(path string) bool {
	err := openNoLinks(path)
	return err == nil || err == unix.ENOENT
}

// resolve is filepath.EvalSymlinks, in one system call for a clean path that exists without a symlink in
// it, the common case.
func resolve(path string) (string, error) {
	if filepath.Clean(path) == path && openNoLinks(path) == nil {
		return path, nil
	}
	return filepath.EvalSymlinks(path)
}

// openNoLinks opens path (O_PATH) and closes it, failing at the first symlink of any component.
func openNoLinks(path string) error {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// Device checks a backing path for a volume of type t (UNSPECIFIED is taken as BLOCK) and returns it
// resolved with its device number. It promises: the path is absolute and valid (see TargetPath's string
// rules, except cleanliness), every symlink in it resolves, the resolved path matches a DeviceAllow
// pattern, and the resolved file is a block device for BLOCK, a regular file for FILE (which also needs
// AllowFileBacked), and for PMEM a persistent-memory block device (the kernel's kind pmem, such as an
// fsdax namespace /dev/pmemN) or, with AllowFileBacked, a regular file, of a positive multiple of
// PmemAlign bytes (the device's size as sysfs says, or the file's). A block device is also checked against what the kernel says of its
// number (see kernelDevice): its name, and its kind against DeviceAllowKinds. The number is the block device's major and minor, or for a file the major
// and minor of its file system's device and its inode. A refusal is a *errdefs.FieldError naming field.
//
// At claim time, use SameDevice, which calls Device and compares the result with what was staged.
func (v *Validator) Device(field, path string, t crustv1.VolumeType) (resolved string, dn *crustv1.DeviceNumber, err error) {
	switch t {
	case crustv1.VolumeType_VOLUME_TYPE_UNSPECIFIED:
		t = crustv1.VolumeType_VOLUME_TYPE_BLOCK
	case crustv1.VolumeType_VOLUME_TYPE_BLOCK, crustv1.VolumeType_VOLUME_TYPE_PMEM:
	case crustv1.VolumeType_VOLUME_TYPE_FILE:
		if !v.allowFile {
			return "", nil, errdefs.Field(field, "is an image file (VOLUME_TYPE_FILE), which is refused: crustd "+
				"runs without --allow-file-backed")
		}
	default:
		return "", nil, errdefs.Field(field, "volume type %d is not known", int32(t))
	}
	if err := absPathString(field, path); err != nil {
		return "", nil, err
	}

	resolved, err = resolve(path)
	if err != nil {
		return "", nil, errdefs.Field(field, "%q cannot be resolved: %v", path, unwrapPathError(err))
	}
	if !v.deviceAllowed(resolved) {
		return "", nil, errdefs.Field(field, "%q resolves to %q, which matches none of the --device-allow patterns %q",
			path, resolved, v.allow)
	}

	var st unix.Stat_t
	if err := unix.Lstat(resolved, &st); err != nil {
		return "", nil, errdefs.Field(field, "%q cannot be checked: %v", resolved, err)
	}
	kind := st.Mode & unix.S_IFMT
	if t == crustv1.VolumeType_VOLUME_TYPE_PMEM && kind == unix.S_IFREG && !v.allowFile {
		return "", nil, errdefs.Field(field, "%q is a regular file: a file-backed persistent-memory volume is refused, "+
			"crustd runs without --allow-file-backed", resolved)
	}
	if t == crustv1.VolumeType_VOLUME_TYPE_FILE || (t == crustv1.VolumeType_VOLUME_TYPE_PMEM && kind == unix.S_IFREG) {
		switch kind {
		case unix.S_IFREG:
			if t == crustv1.VolumeType_VOLUME_TYPE_PMEM {
				if err := pmemSize(field, resolved, st.Size); err != nil {
					return "", nil, err
				}
			}
			return resolved, &crustv1.DeviceNumber{
				Major: unix.Major(uint64(st.Dev)), // Dev is not uint64 on every arch
				Minor: unix.Minor(uint64(st.Dev)),
				Inode: st.Ino,
			}, nil
		case unix.S_IFBLK:
			return "", nil, errdefs.Field(field, "%q is a block device, not a regular file (use volume_type "+
				"VOLUME_TYPE_BLOCK)", resolved)
		}
		return "", nil, errdefs.Field(field, "%q is a %s, not a regular file", resolved, describe(kind))
	}
	switch kind {
	case unix.S_IFBLK:
		dn := &crustv1.DeviceNumber{
			Major: unix.Major(uint64(st.Rdev)), // Rdev is not uint64 on every arch
			Minor: unix.Minor(uint64(st.Rdev)),
		}
		bd, err := v.kernelDevice(field, resolved, dn)
		if err != nil {
			return "", nil, err
		}
		if t == crustv1.VolumeType_VOLUME_TYPE_PMEM {
			if bd.Kind != hostdev.KindPMEM {
				return "", nil, errdefs.Field(field, "%q is a %s device (/dev/%s), not persistent memory: a "+
					"VOLUME_TYPE_PMEM volume is a pmem namespace such as /dev/pmem0 (or, with --allow-file-backed, a "+
					"regular file)", resolved, bd.Kind, bd.Name)
			}
			if err := pmemSize(field, resolved, bd.Bytes); err != nil {
				return "", nil, err
			}
		}
		return resolved, dn, nil
	case unix.S_IFREG:
		return "", nil, errdefs.Field(field, "%q is a regular file, not a block device (an image file needs "+
			"volume_type VOLUME_TYPE_FILE)", resolved)
	}
	return "", nil, errdefs.Field(field, "%q is a %s, not a block device", resolved, describe(kind))
}

// SameDevice checks, at claim time, that vol's backing path still names the device that was staged: it
// runs Device again under the current configuration and compares the resolved path and the device number
// with vol's. nil means they match; otherwise the error wraps errdefs.ErrFailedPrecondition (and not
// ErrInvalidArgument) and says what changed.
func (v *Validator) SameDevice(vol *crustv1.Volume) error {
	spec := vol.GetSpec()
	resolved, dn, err := v.Device("volume_backing_path", spec.GetVolumeBackingPath(), spec.GetVolumeType())
	if err != nil {
		var fe *errdefs.FieldError
		if errors.As(err, &fe) {
			return fmt.Errorf("the staged device is no longer usable: volume_backing_path: %s: %w",
				fe.Reason, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("the staged device is no longer usable: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	if resolved != vol.GetResolvedBackingPath() {
		return fmt.Errorf("volume_backing_path %q now resolves to %q, not %q as staged: %w",
			spec.GetVolumeBackingPath(), resolved, vol.GetResolvedBackingPath(), errdefs.ErrFailedPrecondition)
	}
	if !proto.Equal(dn, vol.GetDeviceNumber()) {
		return fmt.Errorf("%q is now device %s, not %s as staged: %w",
			resolved, formatDN(dn), formatDN(vol.GetDeviceNumber()), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// kernelDevice checks a block device node against what the kernel says about its number
// (/sys/dev/block/MAJ:MIN): the kernel has such a device; a node under /dev carries one of the kernel's
// names for it, so that a node made elsewhere with another device's number cannot pass for an allowed
// name; a node outside /dev is admitted only when the kernel's name for it matches DeviceAllow as well;
// and the device's kind is one DeviceAllowKinds admits.
func (v *Validator) kernelDevice(field, resolved string, dn *crustv1.DeviceNumber) (*hostdev.BlockDevice, error) {
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", dn.GetMajor(), dn.GetMinor())
	bd, err := v.sysfs.Block(dn.GetMajor(), dn.GetMinor())
	if errors.Is(err, hostdev.ErrNoBlockDevice) {
		return nil, errdefs.Field(field, "%q is block device %s, which the kernel does not have (no %s)",
			resolved, formatDN(dn), sys)
	}
	if err != nil {
		return nil, errdefs.Field(field, "%q cannot be checked against what the kernel says of it: %v", resolved, err)
	}
	if rel, ok := strings.CutPrefix(resolved, "/dev/"); ok {
		if !slices.Contains(bd.Names, rel) {
			return nil, errdefs.Field(field, "%q is block device %s, which the kernel calls /dev/%s (%s): a device "+
				"node under /dev must carry the kernel's name for its number", resolved, formatDN(dn), bd.Name, sys)
		}
	} else if !slices.ContainsFunc(bd.Names, func(n string) bool { return v.deviceAllowed("/dev/" + n) }) {
		return nil, errdefs.Field(field, "%q is block device %s, which the kernel calls /dev/%s (%s); that name "+
			"matches none of the --device-allow patterns %q", resolved, formatDN(dn), bd.Name, sys, v.allow)
	}
	if v.kinds != nil && !v.kinds[bd.Kind] {
		return nil, errdefs.Field(field, "%q is a %s device (/dev/%s, as %s says), a kind --device-allow-kind "+
			"does not allow (it allows %s)", resolved, bd.Kind, bd.Name, sys, v.kindList())
	}
	return bd, nil
}

// kindList names the allowed kinds in hostdev.Kinds' order.
func (v *Validator) kindList() string {
	var out []string
	for _, k := range hostdev.Kinds {
		if v.kinds[k] {
			out = append(out, string(k))
		}
	}
	return strings.Join(out, ", ")
}

func (v *Validator) deviceAllowed(resolved string) bool {
	for _, p := range v.allow {
		if ok, _ := filepath.Match(p, resolved); ok { // patterns were checked in New
			return true
		}
	}
	return false
}

func formatDN(dn *crustv1.DeviceNumber) string {
	if dn == nil {
		return "(none)"
	}
	if dn.GetInode() != 0 {
		return fmt.Sprintf("%d:%d inode %d", dn.GetMajor(), dn.GetMinor(), dn.GetInode())
	}
	return fmt.Sprintf("%d:%d", dn.GetMajor(), dn.GetMinor())
}

func describe(kind uint32) string {
	switch kind {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "file of unknown type"
}

// unwrapPathError drops the path from a *fs.PathError, whose path may be a resolved form the caller did
// not send.
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
