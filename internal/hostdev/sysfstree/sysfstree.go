// Package sysfstree lays out block devices in a directory as the kernel lays them out in sysfs
// (Documentation/ABI/stable/sysfs-block), for tests that need a device this host does not have: an NVMe
// namespace, persistent memory, device-mapper, or more devices than it is reasonable to attach.
package sysfstree

import (
	"fmt"
	"os"
	"path/filepath"
)

// Device is one block device of a tree.
type Device struct {
	// Dir is the device's directory below <root>/devices, such as "virtual/block/dm-0".
	Dir string
	// Major and Minor are its number; <root>/dev/block/MAJ:MIN links to Dir.
	Major, Minor uint32
	// Name is its uevent DEVNAME.
	Name string
	// Parent, when set, is its parent device's directory below <root>/devices (the "device" link), and
	// Subsystem that parent's subsystem, a path below root such as "bus/virtio".
	Parent, Subsystem string
	// Files are more files in Dir (a name such as "partition" or "dm/name", and its content).
	Files map[string]string
	// Holders are the directories, below <root>/devices, of the devices built on this one (device-mapper,
	// md): each gets the link <Dir>/holders/<its base name>, and the holder the link
	// <holder>/slaves/<this one's base name>, as the kernel makes them. A partition is not a holder: it is
	// a directory below its disk's, with "partition", "start" and "size" files.
	Holders []string
}

// Add adds d to the tree at root. A parent's subsystem link is made once.
func Add(root string, d Device) error {
	dir := filepath.Join(root, "devices", d.Dir)
	files := map[string]string{
		"uevent": fmt.Sprintf("MAJOR=%d\nMINOR=%d\nDEVNAME=%s\nDEVTYPE=disk\n", d.Major, d.Minor, d.Name),
		"dev":    fmt.Sprintf("%d:%d\n", d.Major, d.Minor),
	}
	for k, v := range d.Files {
		files[k] = v
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	if d.Parent != "" {
		parent := filepath.Join(root, "devices", d.Parent)
		if err := link(parent, filepath.Join(dir, "device")); err != nil {
			return err
		}
		sub := filepath.Join(parent, "subsystem")
		if _, err := os.Lstat(sub); os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Join(root, d.Subsystem), 0o755); err != nil {
				return err
			}
			if err := link(filepath.Join(root, d.Subsystem), sub); err != nil {
				return err
			}
		}
	}
	for _, h := range d.Holders {
		if err := link(filepath.Join(root, "devices", h), filepath.Join(dir, "holders", filepath.Base(h))); err != nil {
			return err
		}
		if err := link(dir, filepath.Join(root, "devices", h, "slaves", filepath.Base(d.Dir))); err != nil {
			return err
		}
	}
	return link(dir, filepath.Join(root, "dev", "block", fmt.Sprintf("%d:%d", d.Major, d.Minor)))
}

// link makes a relative symlink at at to target (creating both directories), replacing one there.
func link(target, at string) error {
	for _, d := range []string{target, filepath.Dir(at)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	rel, err := filepath.Rel(filepath.Dir(at), target)
	if err != nil {
		return err
	}
	_ = os.Remove(at)
	return os.Symlink(rel, at)
}
