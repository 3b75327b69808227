package validate

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev/sysfstree"
)

// TestPmemVolumes: a VOLUME_TYPE_PMEM backing is a persistent-memory block device (by the kernel's kind,
// read from sysfs, whatever its name) or, with --allow-file-backed, a regular file; either way its size is
// a positive multiple of 2 MiB. Every refusal names spec.volume_backing_path and says why.
//
// The host has no persistent memory, so a sysfs tree says what the kernel would: two pmem namespaces of
// 4 MiB and 1 MiB (their parents on the nd bus), and a loop device.
func TestPmemVolumes(t *testing.T) {
	e := newEnv(t)
	sysfs := t.TempDir()
	add := func(name string, dev uint64, size int64, nd bool) string {
		d := sysfstree.Device{Dir: "virtual/block/" + name, Major: unix.Major(dev), Minor: unix.Minor(dev), Name: name,
			Files: map[string]string{"size": fmt.Sprintf("%d\n", size/512)}}
		if nd {
			d.Dir = "platform/ndbus0/region0/namespace0.0/block/" + name
			d.Parent, d.Subsystem = "platform/ndbus0/region0/namespace0.0", "bus/nd"
		}
		must(t, sysfstree.Add(sysfs, d))
		node := filepath.Join(e.dev, name)
		must(t, unix.Mknod(node, unix.S_IFBLK|0o600, int(dev)))
		return node
	}
	okPmem := add("pmem0", unix.Mkdev(259, 900), 4<<20, true)
	smallPmem := add("pmem1", unix.Mkdev(259, 901), 1<<20, true)
	loop := add("loop9", unix.Mkdev(e.loops[0].major, e.loops[0].minor), 4<<20, false)
	file := func(name string, size int64) string {
		p := filepath.Join(e.dev, name)
		must(t, os.WriteFile(p, nil, 0o600))
		must(t, os.Truncate(p, size))
		return p
	}
	okFile, oddFile, emptyFile := file("pmem.img", 6<<20), file("odd.img", 3<<20), file("empty.img", 0)

	allow := []string{e.dev + "/*", "/dev/pmem*", "/dev/loop*"}
	withFiles, err := New(Config{KubeletDir: e.root, DeviceAllow: allow, Sysfs: sysfs, AllowFileBacked: true})
	must(t, err)
	noFiles, err := New(Config{KubeletDir: e.root, DeviceAllow: allow, Sysfs: sysfs})
	must(t, err)

	for _, tc := range []struct {
		name    string
		v       *Validator
		backing string
		reason  string // "" means accepted
	}{
		{name: "pmem namespace", v: noFiles, backing: okPmem},
		{name: "file, file-backed allowed", v: withFiles, backing: okFile},
		{name: "pmem namespace of 1 MiB", v: noFiles, backing: smallPmem,
			reason: fmt.Sprintf("%q is 1048576 bytes: a persistent-memory volume must be a positive multiple of 2 MiB", smallPmem)},
		{name: "a loop device is no persistent memory", v: withFiles, backing: loop,
			reason: fmt.Sprintf("%q is a loop device (/dev/loop9), not persistent memory", loop)},
		{name: "file, file-backed refused", v: noFiles, backing: okFile,
			reason: fmt.Sprintf("%q is a regular file: a file-backed persistent-memory volume is refused, crustd runs without --allow-file-backed", okFile)},
		{name: "file of 3 MiB", v: withFiles, backing: oddFile,
			reason: fmt.Sprintf("%q is 3145728 bytes: a persistent-memory volume must be a positive multiple of 2 MiB", oddFile)},
		{name: "empty file", v: withFiles, backing: emptyFile, reason: fmt.Sprintf("%q is 0 bytes", emptyFile)},
		{name: "directory", v: withFiles, backing: e.dir, reason: "is a directory, not a block device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := e.good()
			spec.VolumeType = crustv1.VolumeType_VOLUME_TYPE_PMEM
			spec.VolumeBackingPath = tc.backing
			c, err := tc.v.Spec(spec)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if c.ResolvedBackingPath != tc.backing || c.Spec.GetVolumeType() != crustv1.VolumeType_VOLUME_TYPE_PMEM {
					t.Errorf("accepted as %s, %v", c.ResolvedBackingPath, c.Spec.GetVolumeType())
				}
				return
			}
			var fe *errdefs.FieldError
			if !errors.As(err, &fe) || fe.Field != "spec.volume_backing_path" || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("got %v; want a refusal of spec.volume_backing_path saying %q", err, tc.reason)
			}
		})
	}
}
