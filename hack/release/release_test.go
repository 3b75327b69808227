package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const testVersion = "v1.2.3-dev"

// finish, over a release of one image archive (this test binary as its Go program, for two platforms)
// and a chart, writes an SBOM naming the program on each platform and the modules it links, and
// SHA256SUMS that sha256sum verifies; a file without the version in its name is refused.
func TestFinish(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	writeIndexArchive(t, filepath.Join(dir, "fake-"+testVersion+".oci.tar"), "docker.io/crust/fake:"+testVersion,
		map[string][]byte{"usr/local/bin/fake": prog, "usr/bin/not-go": []byte("#!/bin/sh\n"), "usr/bin/dpkg": []byte("a host tool")})
	if err := os.WriteFile(filepath.Join(dir, "crust-1.2.3-dev.tgz"), []byte("chart"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, imagesList), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := finish(dir, testVersion); err != nil {
		t.Fatal(err)
	}

	check := exec.Command("sha256sum", "-c", "--strict", sumsFile)
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, out)
	}
	sums, err := os.ReadFile(filepath.Join(dir, sumsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"  fake-" + testVersion + ".oci.tar\n", "  crust-1.2.3-dev.tgz\n", "  " + sbomName(testVersion) + "\n"} {
		if !strings.Contains(string(sums), want) {
			t.Errorf("SHA256SUMS has no line for%s:\n%s", strings.TrimSuffix(want, "\n"), sums)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, imagesList)); !os.IsNotExist(err) {
		t.Errorf("%s is still there (%v)", imagesList, err)
	}

	raw, err := os.ReadFile(filepath.Join(dir, sbomName(testVersion)))
	if err != nil {
		t.Fatal(err)
	}
	var doc bom
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.5" || doc.Metadata.Component.Version != testVersion || !strings.HasPrefix(doc.SerialNumber, "urn:uuid:") {
		t.Errorf("SBOM header: %+v", doc)
	}
	platforms := map[string]bool{}
	var libs []string
	for _, c := range doc.Components {
		switch c.Type {
		case "application":
			props := map[string]string{}
			for _, p := range c.Properties {
				props[p.Name] = p.Value
			}
			if props["crust:path"] != "/usr/local/bin/fake" || props["crust:image"] != "docker.io/crust/fake:"+testVersion || c.Version != testVersion {
				t.Errorf("application component %+v, want /usr/local/bin/fake of the image at %s", c, testVersion)
			}
			platforms[props["crust:platform"]] = true
		case "library":
			libs = append(libs, c.PURL)
		}
	}
	if len(platforms) != 2 || !platforms["linux/amd64"] || !platforms["linux/arm64"] {
		t.Errorf("the SBOM names the program on %v, want linux/amd64 and linux/arm64", platforms)
	}
	if !strings.Contains(strings.Join(libs, " "), "pkg:golang/github.com/google/go-containerregistry@") {
		t.Errorf("the SBOM's libraries %v lack go-containerregistry, which the program links", libs)
	}
	if _, err := exec.LookPath("dpkg-query"); err == nil && !strings.Contains(strings.Join(libs, " "), "pkg:deb/debian/dpkg@") {
		t.Errorf("the SBOM's libraries %v lack the Debian package dpkg, which /usr/bin/dpkg in the image comes from", libs)
	}

	writeIndexArchive(t, filepath.Join(dir, "old-"+testVersion+".oci.tar"), "docker.io/crust/old:v1.2.2",
		map[string][]byte{"usr/local/bin/fake": prog})
	if err := finish(dir, testVersion); err == nil || !strings.Contains(err.Error(), "old-"+testVersion+".oci.tar") {
		t.Errorf("finish with an image tagged v1.2.2: %v, want it refused by name", err)
	}
	if err := os.Remove(filepath.Join(dir, "old-"+testVersion+".oci.tar")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := finish(dir, testVersion); err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("finish with notes.txt: %v, want it refused by name", err)
	}
}

// writeIndexArchive writes an oci-archive as hack/images -platforms does: one index named name holding a
// linux/amd64 and a linux/arm64 image whose single layer holds files (executable).
func writeIndexArchive(t *testing.T, file, name string, files map[string][]byte) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for p, data := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o755, Size: int64(len(data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var adds []mutate.IndexAddendum
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := mutate.AppendLayers(empty.Image, static.NewLayer(layer.Bytes(), types.OCIUncompressedLayer))
		if err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"io.containerd.image.name": name})); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-cf", file, "-C", dir, "oci-layout", "index.json", "blobs").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
}
