package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// defaultPath is every image's PATH.
const defaultPath = "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"

// entry is one file, directory or symlink of a layer.
type entry struct {
	typ  byte   // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode int64  // permission bits with setuid, setgid and sticky, as tar stores them
	link string // a symlink's target
	data []byte // a regular file's contents
}

// fsTree is the filesystem of a single-layer image, keyed by clean path without the leading slash.
// Adding a path adds its missing parent directories (0755); adding the same file or symlink twice is
// allowed, a different one at a taken path is an error, and so is a path below a symlink or a file.
type fsTree struct {
	entries map[string]*entry
}

func newTree() *fsTree { return &fsTree{entries: map[string]*entry{}} }

// clean turns p into the tree's key: cleaned, relative to the root.
func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// parents adds the missing parent directories of key.
func (t *fsTree) parents(key string) error {
	dir := path.Dir(key)
	if dir == "." {
		return nil
	}
	if e, ok := t.entries[dir]; ok {
		if e.typ != tar.TypeDir {
			return fmt.Errorf("/%s: parent /%s is not a directory", key, dir)
		}
		return nil
	}
	if err := t.parents(dir); err != nil {
		return err
	}
	t.entries[dir] = &entry{typ: tar.TypeDir, mode: 0o755}
	return nil
}

// put adds e at p unless an equal entry is there already.
func (t *fsTree) put(p string, e *entry) error {
	key := clean(p)
	if key == "" {
		return fmt.Errorf("cannot add the root directory")
	}
	if old, ok := t.entries[key]; ok {
		if old.typ == e.typ && old.mode == e.mode && old.link == e.link && bytes.Equal(old.data, e.data) {
			return nil
		}
		return fmt.Errorf("/%s: already in the layer as something else", key)
	}
	if err := t.parents(key); err != nil {
		return err
	}
	t.entries[key] = e
	return nil
}

// dir adds directory p with mode, or sets the mode of directory p when it is there already.
func (t *fsTree) dir(p string, mode int64) error {
	if e, ok := t.entries[clean(p)]; ok && e.typ == tar.TypeDir {
		e.mode = mode
		return nil
	}
	return t.put(p, &entry{typ: tar.TypeDir, mode: mode})
}

// file adds the regular file p.
func (t *fsTree) file(p string, mode int64, data []byte) error {
	return t.put(p, &entry{typ: tar.TypeReg, mode: mode, data: data})
}

// symlink adds the symlink p pointing at target.
func (t *fsTree) symlink(p, target string) error {
	return t.put(p, &entry{typ: tar.TypeSymlink, mode: 0o777, link: target})
}

// skeleton adds the directories every image has: /tmp (1777), /run, /etc, /dev, /proc, /sys, /var/lib.
func (t *fsTree) skeleton() error {
	if err := t.dir("/tmp", 0o1777); err != nil {
		return err
	}
	for _, d := range []string{"/run", "/etc", "/dev", "/proc", "/sys", "/var/lib"} {
		if err := t.dir(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// tarMode returns the mode bits tar stores for m: permissions, setuid, setgid and sticky.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// tar returns the tree as a tar stream: entries sorted by path (so every directory comes before its
// contents), owned by 0:0, modification time 0.
func (t *fsTree) tar() ([]byte, error) {
	keys := make([]string, 0, len(t.entries))
	for k := range t.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, k := range keys {
		e := t.entries[k]
		h := &tar.Header{
			Typeflag: e.typ,
			Name:     k,
			Linkname: e.link,
			Mode:     e.mode,
			ModTime:  time.Unix(0, 0),
		}
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// image returns a linux/arch image (arch a GOARCH name) whose single layer is the tree, with the
// entrypoint and PATH; with OCI media types when oci is set, else Docker's.
func (t *fsTree) image(entrypoint []string, arch string, oci bool) (v1.Image, error) {
	b, err := t.tar()
	if err != nil {
		return nil, err
	}
	opts := []tarball.LayerOption{tarball.WithCompressedCaching}
	base := empty.Image
	if oci {
		opts = append(opts, tarball.WithMediaType(types.OCILayer))
		base = mutate.ConfigMediaType(mutate.MediaType(base, types.OCIManifestSchema1), types.OCIConfigJSON)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, opts...)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	epoch := v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Created = epoch
	for i := range cf.History {
		cf.History[i].Created = epoch
		cf.History[i].CreatedBy = "crust hack/images"
	}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{defaultPath}
	cf.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cf)
}

// tarDir writes the files under dir (regular files and directories only, as an OCI image layout has) to
// the tar archive file, with paths relative to dir: sorted, owned by 0:0, modification time 0, files
// 0644 and directories 0755, so that the same contents give the same archive.
func tarDir(dir, file string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	tw := tar.NewWriter(f)
	for _, p := range paths {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: filepath.ToSlash(rel), Mode: 0o644, Size: fi.Size(), ModTime: time.Unix(0, 0)}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode, h.Size = tar.TypeDir, h.Name+"/", 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.IsDir() {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// copyFile copies the contents of the file p to w.
func copyFile(w io.Writer, p string) error {
	src, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	_, err = io.Copy(w, src)
	return err
}
