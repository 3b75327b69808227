// Package initramfs builds the crust guest's initramfs: an uncompressed newc
// cpio archive, as the Linux kernel unpacks it into its first root
// filesystem, holding crust-guest as /init, the kernel modules it loads, and
// busybox and the filesystem tools it runs.
//
// The archive is not compressed because the guest would spend its boot
// decompressing it: under TCG, gunzipping the 14 MB archive (32 MB
// unpacked) took about half a second of every boot, where copying it costs
// next to nothing. Its size on the host is all it costs.
//
// Writer is the general part (files, directories and symlinks into the
// archive); Guest and LoadAssets lay out the crust guest from the assets
// hack/guest/fetch-kernel.sh gathers.
package initramfs

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"
)

// Writer writes an uncompressed newc cpio archive. Entry names are paths
// relative to the archive's root ("/init" and "init" are the same entry).
// Missing parent directories are added (mode 0755) before an entry, so the
// kernel can unpack the archive in order. Entries are owned by root and
// carry a fixed modification time, so the same inputs give the same bytes.
type Writer struct {
	cpio *cpio.Writer
	seen map[string]bool // entries written, by clean name
	err  error
}

// NewWriter returns a Writer writing to w. Close must be called to finish
// the archive; it does not close w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{cpio: cpio.NewWriter(w), seen: map[string]bool{".": true}}
}

// epoch is the modification time of every entry.
var epoch = time.Unix(0, 0)

func clean(name string) (string, error) {
	n := strings.TrimPrefix(path.Clean("/"+name), "/")
	if n == "" {
		return "", fmt.Errorf("initramfs: empty entry name %q", name)
	}
	return n, nil
}

func (w *Writer) header(name string, mode cpio.FileMode, size int64) error {
	if w.err != nil {
		return w.err
	}
	if err := w.parents(name); err != nil {
		return err
	}
	w.seen[name] = true
	w.err = w.cpio.WriteHeader(&cpio.Header{Name: name, Mode: mode, Size: size, ModTime: epoch, Links: 1})
	return w.err
}

func (w *Writer) parents(name string) error {
	dir := path.Dir(name)
	if w.seen[dir] {
		return nil
	}
	if err := w.parents(dir); err != nil {
		return err
	}
	w.seen[dir] = true
	w.err = w.cpio.WriteHeader(&cpio.Header{Name: dir, Mode: cpio.TypeDir | 0o755, ModTime: epoch, Links: 2})
	return w.err
}

func perm(m fs.FileMode) cpio.FileMode {
	p := cpio.FileMode(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= cpio.ModeSetuid
	}
	if m&fs.ModeSetgid != 0 {
		p |= cpio.ModeSetgid
	}
	if m&fs.ModeSticky != 0 {
		p |= cpio.ModeSticky
	}
	return p
}

// Mkdir adds a directory. Adding one that is already there does nothing.
func (w *Writer) Mkdir(name string, mode fs.FileMode) error {
	n, err := clean(name)
	if err != nil {
		return err
	}
	if w.seen[n] {
		return nil
	}
	if err := w.header(n, cpio.TypeDir|perm(mode), 0); err != nil {
		return err
	}
	return nil
}

// WriteFile adds a regular file with the given contents.
func (w *Writer) WriteFile(name string, mode fs.FileMode, data []byte) error {
	n, err := clean(name)
	if err != nil {
		return err
	}
	if err := w.header(n, cpio.TypeReg|perm(mode), int64(len(data))); err != nil {
		return err
	}
	_, w.err = w.cpio.Write(data)
	return w.err
}

// CopyFile adds a regular file with the contents of the host file src
// (symlinks followed) and the given mode.
func (w *Writer) CopyFile(name string, mode fs.FileMode, src string) error {
	n, err := clean(name)
	if err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("initramfs: %s is not a regular file", src)
	}
	if err := w.header(n, cpio.TypeReg|perm(mode), st.Size()); err != nil {
		return err
	}
	if _, err := io.Copy(w.cpio, f); err != nil {
		w.err = fmt.Errorf("initramfs: copying %s: %w", src, err)
	}
	return w.err
}

// Symlink adds a symbolic link name pointing at target.
func (w *Writer) Symlink(name, target string) error {
	n, err := clean(name)
	if err != nil {
		return err
	}
	if err := w.header(n, cpio.TypeSymlink|0o777, int64(len(target))); err != nil {
		return err
	}
	_, w.err = io.WriteString(w.cpio, target)
	return w.err
}

// CopyTree adds the host directory tree rooted at dir under the archive's
// root: directories, regular files (with their permissions) and symlinks
// (as they are). Other file types and names starting with '.' at the top of
// dir (stamps, caches) are skipped.
func (w *Writer) CopyTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		if !strings.Contains(rel, string(filepath.Separator)) && strings.HasPrefix(rel, ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		switch {
		case d.IsDir():
			return w.Mkdir(rel, info.Mode())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
			return w.Symlink(rel, target)
		case info.Mode().IsRegular():
			return w.CopyFile(rel, info.Mode(), p)
		}
		return nil
	})
}

// Close writes the archive's trailer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if err := w.cpio.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}
