package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// programsOf returns the Go programs in every image of the OCI image index archive file (an OCI image
// layout in a tar archive, as hack/images -platforms writes it): each regular, executable file of an
// image's filesystem that carries Go's build information.
func programsOf(file string) ([]program, error) {
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
	var out []program
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
			ps, err := goPrograms(img)
			if err != nil {
				return nil, fmt.Errorf("%s (%s): %w", name, m.Platform, err)
			}
			for i := range ps {
				ps[i].image, ps[i].platform = name, m.Platform.OS+"/"+m.Platform.Architecture
			}
			out = append(out, ps...)
		}
	}
	sortPrograms(out)
	return out, nil
}

// goPrograms returns the Go programs of img's filesystem, with their paths; image and platform are left
// to the caller.
func goPrograms(img v1.Image) ([]program, error) {
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	var out []program
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		info, err := buildinfo.Read(bytes.NewReader(data))
		if err != nil {
			continue // not a Go program (a host tool, a library)
		}
		out = append(out, program{path: "/" + strings.TrimPrefix(h.Name, "/"), info: info})
	}
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
