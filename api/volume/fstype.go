package volume

import "slices"

// DefaultFSType is the filesystem type of a volume whose request names none (CSI leaves the default to
// the plugin).
const DefaultFSType = "ext4"

// filesystems is the one table of filesystem types. formatted says whether crust's reference runtime
// handler and reference CSI driver make, mount and grow it (their guest and host carry e2fsprogs and
// xfsprogs, and no btrfs-progs).
var filesystems = []struct {
	name      string
	formatted bool
}{
	{"ext4", true},
	{"ext3", true},
	{"xfs", true},
	{"btrfs", false},
}

// FSTypes are the filesystem types a volume descriptor may name (crustd refuses any other fs_type), in
// the order messages list them. A runtime handler mounts them in the sandbox; Kata's guest mounts each.
// The list is a copy: changing it changes nothing.
func FSTypes() []string { return names(func(bool) bool { return true }) }

// FormattedFSTypes is the part of FSTypes that crust's reference implementations create and grow: the
// reference handler's guest (create_filesystem, online expansion) and the reference CSI driver. btrfs is
// left out because neither carries its tools; a handler whose guest has them may still mount it. ext2 is
// in neither list: it has no journal, and crust never hands it to a handler.
func FormattedFSTypes() []string { return names(func(f bool) bool { return f }) }

// IsFSType reports whether t is one of FSTypes.
func IsFSType(t string) bool { return slices.Contains(FSTypes(), t) }

// IsFormattedFSType reports whether t is one of FormattedFSTypes.
func IsFormattedFSType(t string) bool { return slices.Contains(FormattedFSTypes(), t) }

func names(keep func(formatted bool) bool) []string {
	var out []string
	for _, f := range filesystems {
		if keep(f.formatted) {
			out = append(out, f.name)
		}
	}
	return out
}
