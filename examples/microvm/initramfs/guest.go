package initramfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"crust.dev/crust/examples/microvm/agentproto"
)

// Assets are the host files a guest is made of, for one kernel flavour.
type Assets struct {
	// Kernel is the kernel image to boot (QEMU -kernel).
	Kernel string
	// Modules are the kernel modules, in load order.
	Modules []string
	// Tools is a directory tree merged into the guest's root: busybox and
	// its applet links, the filesystem tools and their libraries.
	Tools string
}

// LoadAssets reads the layout hack/guest/fetch-kernel.sh writes under dir for
// flavour ("cloud", or "generic" with --with-9p): dir/FLAVOUR/vmlinux,
// dir/FLAVOUR/modules.load naming files of dir/FLAVOUR/modules, and dir/tools.
// It checks that every file is there.
func LoadAssets(dir, flavour string) (Assets, error) {
	base := filepath.Join(dir, flavour)
	a := Assets{Kernel: filepath.Join(base, "vmlinux"), Tools: filepath.Join(dir, "tools")}
	for _, p := range []string{a.Kernel, filepath.Join(a.Tools, "bin", "busybox")} {
		if _, err := os.Stat(p); err != nil {
			return Assets{}, fmt.Errorf("initramfs: guest assets: %w", err)
		}
	}
	f, err := os.Open(filepath.Join(base, "modules.load"))
	if err != nil {
		return Assets{}, fmt.Errorf("initramfs: guest assets: %w", err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		if name != filepath.Base(name) {
			return Assets{}, fmt.Errorf("initramfs: modules.load: %q is not a file name", name)
		}
		p := filepath.Join(base, "modules", name)
		if _, err := os.Stat(p); err != nil {
			return Assets{}, fmt.Errorf("initramfs: guest assets: %w", err)
		}
		a.Modules = append(a.Modules, p)
	}
	if err := sc.Err(); err != nil {
		return Assets{}, fmt.Errorf("initramfs: modules.load: %w", err)
	}
	return a, nil
}

// Guest describes the crust guest's initramfs.
type Guest struct {
	// Agent is the static crust-guest binary; it becomes /init.
	Agent string
	// Modules are kernel modules in load order. They go to
	// agentproto.ModulesDir under their base names, listed in that order in
	// agentproto.ModuleList.
	Modules []string
	// Tools is a directory tree merged into the root (may be empty).
	Tools string
	// Files are more host files added after Tools (a benchmark's programs,
	// from Executable). One whose name the archive already holds is left out:
	// the tools' shared libraries are the host's, as a program's are.
	Files []File
}

// File is a host file added to the guest.
type File struct {
	// Name is its path in the guest.
	Name string
	// Source is the host file, symlinks followed.
	Source string
	// Mode is its permission bits.
	Mode fs.FileMode
}

// Write writes the guest's initramfs to w.
func (g Guest) Write(w io.Writer) error {
	if g.Agent == "" {
		return errors.New("initramfs: guest without an agent")
	}
	a := NewWriter(w)
	for _, d := range []string{"dev", "proc", "sys", "run", "mnt", "etc"} {
		if err := a.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := a.Mkdir("tmp", fs.ModeSticky|0o777); err != nil {
		return err
	}
	// Tools that look for mounted filesystems (resize2fs, xfs_growfs) read
	// /etc/mtab.
	if err := a.Symlink("etc/mtab", "/proc/self/mounts"); err != nil {
		return err
	}
	if err := a.CopyFile("init", 0o755, g.Agent); err != nil {
		return err
	}
	var list strings.Builder
	seen := map[string]bool{}
	for _, m := range g.Modules {
		name := filepath.Base(m)
		if seen[name] {
			return fmt.Errorf("initramfs: module %s listed twice", name)
		}
		seen[name] = true
		if err := a.CopyFile(path.Join(agentproto.ModulesDir, name), 0o644, m); err != nil {
			return err
		}
		list.WriteString(name + "\n")
	}
	if err := a.WriteFile(agentproto.ModuleList, 0o644, []byte(list.String())); err != nil {
		return err
	}
	if g.Tools != "" {
		if err := a.CopyTree(g.Tools); err != nil {
			return err
		}
	}
	for _, f := range g.Files {
		if n, err := clean(f.Name); err != nil {
			return err
		} else if a.seen[n] {
			continue
		}
		if err := a.CopyFile(f.Name, f.Mode, f.Source); err != nil {
			return err
		}
	}
	return a.Close()
}

// WriteFile writes the guest's initramfs to the file at path, replacing it
// only once the whole archive is written.
func (g Guest) WriteFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // a no-op once renamed
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := g.Write(bw); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}
