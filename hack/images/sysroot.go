package main

import (
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// multiarch is the Debian multiarch triplet of each GOARCH an image is built for: the directory its
// libraries are in.
var multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// toolDirs are where a sysroot's commands are looked for, in order.
var toolDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// sysroot is the root filesystem of another architecture that an image's host tools come from: Debian
// packages of that architecture unpacked into a directory (hack/images/sysroot.sh makes one).
type sysroot struct {
	dir  string // the directory, absolute
	arch string // its GOARCH
}

// real returns the path in the image (absolute, within the sysroot) of the sysroot path p, and its file
// on this machine. A directory on the way that is a symbolic link leaving the sysroot is an error.
func (r sysroot) real(p string) (string, string, error) {
	p = path.Clean("/" + p)
	dir, err := filepath.EvalSymlinks(filepath.Join(r.dir, path.Dir(p)))
	if err != nil {
		return "", "", err
	}
	rel, err := filepath.Rel(r.dir, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", "", fmt.Errorf("%s: a directory on the way leads out of the sysroot %s", p, r.dir)
	}
	inImage := path.Join("/", filepath.ToSlash(rel), path.Base(p))
	return inImage, filepath.Join(r.dir, inImage), nil
}

// add copies the sysroot path p into the tree at the same path, as addHost does for this machine's
// files: symlinks reproduced and followed (an absolute target within the sysroot), a regular file copied
// with its mode. It returns the path, in the sysroot, of the file reached.
func (r sysroot) add(t *fsTree, p string) (string, error) {
	orig := p
	for range 40 {
		inImage, file, err := r.real(p)
		if err != nil {
			return "", err
		}
		fi, err := os.Lstat(file)
		if err != nil {
			return "", err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(file)
			if err != nil {
				return "", err
			}
			if err := t.symlink(inImage, target); err != nil {
				return "", err
			}
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(inImage), target)
			}
			p = target
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(file)
			if err != nil {
				return "", err
			}
			return inImage, t.file(inImage, tarMode(fi.Mode()), data)
		default:
			return "", fmt.Errorf("%s: not a regular file or a symlink", file)
		}
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", orig)
}

// addTool copies the command name, found in the sysroot's toolDirs, into the tree with its loader and
// the shared libraries it needs, found by their names in the ELF files (as the loader would, in the
// architecture's multiarch directories), each at its path with its symlinks.
func (r sysroot) addTool(t *fsTree, name string) error {
	for _, dir := range toolDirs {
		if _, err := os.Lstat(filepath.Join(r.dir, dir, name)); err != nil {
			continue
		}
		file, err := r.add(t, path.Join(dir, name))
		if err != nil {
			return fmt.Errorf("%s tool %s: %w", r.arch, name, err)
		}
		return r.addLibs(t, file, map[string]bool{})
	}
	return fmt.Errorf("%s tool %s: not in %s (its Debian package not unpacked there?)", r.arch, name, r.dir)
}

// addLibs adds the loader and the libraries the ELF file at sysroot path p needs, and theirs, skipping
// those in seen.
func (r sysroot) addLibs(t *fsTree, p string, seen map[string]bool) error {
	f, err := elf.Open(filepath.Join(r.dir, p))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer func() { _ = f.Close() }()
	if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[r.arch]; f.Machine != want {
		return fmt.Errorf("%s: an ELF file for %s, not %s", p, f.Machine, r.arch)
	}
	var need []string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: its loader: %w", p, err)
			}
			need = append(need, strings.TrimRight(string(b), "\x00"))
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	for _, lib := range libs {
		found := ""
		for _, dir := range []string{"/lib/" + multiarch[r.arch], "/usr/lib/" + multiarch[r.arch], "/lib", "/usr/lib"} {
			if _, err := os.Stat(filepath.Join(r.dir, dir, lib)); err == nil {
				found = path.Join(dir, lib)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s: library %s not found in %s", p, lib, r.dir)
		}
		need = append(need, found)
	}
	for _, n := range need {
		if seen[n] {
			continue
		}
		seen[n] = true
		file, err := r.add(t, n)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := r.addLibs(t, file, seen); err != nil {
			return err
		}
	}
	return nil
}

// parseSysroots parses -sysroot's value: comma-separated ARCH=DIR (GOARCH names), none for "".
func parseSysroots(s string) (map[string]sysroot, error) {
	roots := map[string]sysroot{}
	if s == "" {
		return roots, nil
	}
	for _, kv := range strings.Split(s, ",") {
		arch, dir, ok := strings.Cut(kv, "=")
		if _, known := multiarch[arch]; !ok || !known || dir == "" {
			return nil, fmt.Errorf("%q is not ARCH=DIR with ARCH amd64 or arm64", kv)
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%s: not a directory (%v)", dir, err)
		}
		roots[arch] = sysroot{dir: abs, arch: arch}
	}
	return roots, nil
}
