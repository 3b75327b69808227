package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// imageContent is what one platform's image of an archive holds.
type imageContent struct {
	image    string    // the image's name (io.containerd.image.name)
	platform string    // os/arch
	programs []program // its Go programs
	files    []string  // the paths of its other regular files, sorted
}

// contentsOf returns what every image of the OCI image index archive file (an OCI image layout in a tar
// archive, as hack/images -platforms writes it) holds: its Go programs, each regular, executable file
// that carries Go's build information, and its other regular files.
func contentsOf(file string) ([]imageContent, error) {
	dir, err := os.MkdirTemp("", "crust-release-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := untar(file, dir); err != nil {
		return nil, err
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []imageContent
	for _, d := range tm.Manifests {
		name := d.Annotations["io.containerd.image.name"]
		if name == "" {
			return nil, fmt.Errorf("index.json: %s has no io.containerd.image.name", d.Digest)
		}
		idx, err := top.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, m := range im.Manifests {
			if m.Platform == nil {
				return nil, fmt.Errorf("%s: manifest %s names no platform", name, m.Digest)
			}
			img, err := idx.Image(m.Digest)
			if err != nil {
				return nil, err
			}
			c := imageContent{image: name, platform: m.Platform.OS + "/" + m.Platform.Architecture}
			if err := c.read(img); err != nil {
				return nil, fmt.Errorf("%s (%s): %w", name, m.Platform, err)
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// elfMachines are the ELF machines of the architectures (GOARCH) a release has images for.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// read fills c's programs and files from img's filesystem. An ELF file for another machine than the
// image's platform is an error: a tool of the wrong architecture would fail only on a node.
func (c *imageContent) read(img v1.Image) error {
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		p := "/" + strings.TrimPrefix(h.Name, "/")
		data, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if f, err := elf.NewFile(bytes.NewReader(data)); err == nil {
			if want := elfMachines[strings.TrimPrefix(c.platform, "linux/")]; f.Machine != want {
				return fmt.Errorf("%s: an ELF file for %s in an image for %s", p, f.Machine, c.platform)
			}
		}
		if info, err := buildinfo.Read(bytes.NewReader(data)); err == nil && h.Mode&0o111 != 0 {
			c.programs = append(c.programs, program{image: c.image, platform: c.platform, path: p, info: info})
			continue
		}
		c.files = append(c.files, p) // a host tool, a library, a configuration file
	}
	sortPrograms(c.programs)
	slices.Sort(c.files)
	return nil
}

// untar extracts the tar archive file, which may hold only directories and regular files with relative
// paths inside dir, into dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("%s: a path outside the archive", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			err = writeFrom(p, tr)
		default:
			err = fmt.Errorf("%s: neither a directory nor a regular file", h.Name)
		}
		if err != nil {
			return err
		}
	}
}

// writeFrom writes what r holds to the new file p, making its directory.
func writeFrom(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
