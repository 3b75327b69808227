package initramfs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Executable returns the host program at bin as Files to add to a guest: the program under its own
// path and, when it is dynamically linked, the shared libraries and the dynamic loader ldd finds for it
// on the host, each under the path the program looks for it at (as hack/guest/fetch-kernel.sh copies
// the guest's tools). A static program is the one file.
func Executable(bin string) ([]File, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	files := []File{{Name: abs, Source: abs, Mode: 0o755}}
	out, err := exec.Command("ldd", abs).Output()
	if err != nil {
		var ee *exec.ExitError
		// ldd fails on a static program, saying so.
		if errors.As(err, &ee) && strings.Contains(string(out)+string(ee.Stderr), "not a dynamic executable") {
			return files, nil
		}
		return nil, fmt.Errorf("initramfs: ldd %s: %w", abs, err)
	}
	libs, err := parseLDD(string(out))
	if err != nil {
		return nil, fmt.Errorf("initramfs: ldd %s: %w", abs, err)
	}
	for _, l := range libs {
		files = append(files, File{Name: l, Source: l, Mode: 0o755})
	}
	return files, nil
}

// parseLDD returns the paths of the libraries in ldd's output: "name => /path (addr)" lines and the
// loader's "/path (addr)" line; the vDSO ("linux-vdso.so.1 (addr)") has no file. A library ldd did not
// find is an error.
func parseLDD(out string) ([]string, error) {
	var libs []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("%s not found", f[0])
		case len(f) == 2 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}
