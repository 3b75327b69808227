package volume

import "slices"

// DefaultFSType is the filesystem type of a volume whose request names none (CSI leaves the default to
// the plugin).
const DefaultFSType = "ext4"

// filesystems is the one table of filesystem types. formatted says whether crust's reference runtime
// handler and reference CSI driver make, mount and grow it (their guest and host carry e2fsprogs and
// xfsprogs, and no btrfs-progs); noReplay is the mount option that keeps a read-only mount from replaying
// its journal or log (see ReadOnlyOptions).
var filesystems = []struct {
	name      string
	formatted bool
	noReplay  string
}{
	{"ext4", true, "noload"},
	{"ext3", true, "noload"},
	{"xfs", true, "norecovery"},
	{"btrfs", false, "nologreplay"},
}

// ReadOnlyOptions are the filesystem options of a read-only mount of fsType beside options: the one that
// keeps the kernel from replaying the journal or log (ext3 and ext4 "noload", xfs "norecovery", btrfs
// "nologreplay"), unless options holds it already; none for another type. A read-only mount that
// replays writes the device, which other read-only holders may be reading and which one writer per device
// gives to nobody while they do: it sees the filesystem as it was last made consistent.
func ReadOnlyOptions(fsType string, options []string) []string {
	for _, f := range filesystems {
		if f.name == fsType && !slices.Contains(options, f.noReplay) {
			return []string{f.noReplay}
		}
	}
	return nil
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
