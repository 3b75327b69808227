package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// rootLinks are the top-level directories a merged-/usr host (Debian 12) has as symlinks into /usr.
var rootLinks = []string{"/bin", "/sbin", "/lib", "/lib64"}

// addRootLinks reproduces those of rootLinks that are symlinks on this host (bin -> usr/bin, ...), so
// that paths through them (a library's /lib64/ld-linux-x86-64.so.2, a script's /bin/sh) resolve in the
// image as on the host.
func (t *fsTree) addRootLinks() error {
	for _, p := range rootLinks {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		if err := t.symlink(p, target); err != nil {
			return err
		}
	}
	return nil
}

// addHost copies the host path p into the tree at its real location: p's directory is resolved first
// (so /lib64/x lands at /usr/lib64/x on a merged-/usr host), a symlink is reproduced as it is and then
// followed, and a regular file is copied with its mode. It returns the real path of the file reached.
// This machine is the sysroot "/".
func (t *fsTree) addHost(p string) (string, error) {
	return sysroot{dir: "/", arch: runtime.GOARCH}.add(t, p)
}

// addHostTool copies the command name, found on PATH, into the tree with the symlinks that lead to its
// real file and the shared libraries (and loader) it needs, each at its real path with its own symlinks.
func (t *fsTree) addHostTool(name string) error {
	p, err := exec.LookPath(name)
	if err != nil {
		return fmt.Errorf("host tool %s: %w (install its Debian package)", name, err)
	}
	file, err := t.addHost(p)
	if err != nil {
		return fmt.Errorf("host tool %s: %w", name, err)
	}
	libs, err := sharedLibs(file)
	if err != nil {
		return fmt.Errorf("host tool %s: %w", name, err)
	}
	for _, lib := range libs {
		if _, err := t.addHost(lib); err != nil {
			return fmt.Errorf("host tool %s: library %w", name, err)
		}
	}
	return nil
}

// sharedLibs returns the shared libraries and the loader the ELF executable bin needs, as ldd lists
// them (for a static executable, none). A library ldd cannot find is an error.
func sharedLibs(bin string) ([]string, error) {
	static, err := isStatic(bin)
	if err != nil {
		return nil, err
	}
	if static {
		return nil, nil
	}
	var stderr bytes.Buffer
	cmd := exec.Command("ldd", bin)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, strings.TrimSpace(stderr.String()))
	}
	return parseLdd(out)
}

// parseLdd returns the library paths of ldd's output: the path after "=>" on a library's line, the
// first word of the loader's line; the vDSO, which has neither, is skipped.
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if soname, rest, ok := strings.Cut(line, "=>"); ok {
			fields := strings.Fields(rest)
			switch {
			case len(fields) >= 2 && fields[0] == "not" && fields[1] == "found":
				return nil, fmt.Errorf("ldd: %s not found", strings.TrimSpace(soname))
			case len(fields) > 0 && strings.HasPrefix(fields[0], "/"):
				libs = append(libs, fields[0])
			}
			continue
		}
		if f := strings.Fields(line); strings.HasPrefix(f[0], "/") {
			libs = append(libs, f[0])
		}
	}
	return libs, sc.Err()
}

// isStatic reports whether the ELF file bin has no program interpreter (needs no loader or libraries).
func isStatic(bin string) (bool, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return false, fmt.Errorf("%s: %w", bin, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return false, errors.New(bin + ": not an ELF executable")
	}
	return true, nil
}
