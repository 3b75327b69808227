package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
	// The image for the other architecture holds a Go program built for it: pause, the smallest here.
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	otherBin := filepath.Join(t.TempDir(), "pause")
	build := exec.Command("go", "build", "-o", otherBin, "../images/pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+other)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build pause for %s: %v\n%s", other, err, out)
	}
	otherProg, err := os.ReadFile(otherBin)
	if err != nil {
		t.Fatal(err)
	}
	tools := func(prog []byte) map[string][]byte {
		return map[string][]byte{"usr/local/bin/fake": prog, "usr/bin/not-go": []byte("#!/bin/sh\n"), "usr/bin/dpkg": []byte("a host tool")}
	}
	writeIndexArchive(t, filepath.Join(dir, "fake-"+testVersion+".oci.tar"), "docker.io/crust/fake:"+testVersion,
		map[string]map[string][]byte{runtime.GOARCH: tools(prog), other: tools(otherProg)})
	if err := os.WriteFile(filepath.Join(dir, "crust-1.2.3-dev.tgz"), []byte("chart"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, imagesList), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The image for the other architecture took its host tools from a sysroot, whose files list says
	// which package /usr/bin/dpkg came from there.
	list := filepath.Join(t.TempDir(), "files.list")
	if err := os.WriteFile(list, []byte("/usr/bin/dpkg dpkg "+other+" 9.9-1\n/usr/bin/other other "+other+" 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := finish(dir, testVersion, map[string]string{other: list}); err != nil {
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
	if purl := "pkg:deb/debian/dpkg@9.9-1?arch=" + other; !slices.Contains(libs, purl) {
		t.Errorf("the SBOM's libraries %v lack %s, which the files list names for the %s image", libs, purl, other)
	}
	if slices.Contains(libs, "pkg:deb/debian/other@1?arch="+other) {
		t.Errorf("the SBOM names a package whose file is in no image")
	}
	hostDpkg := slices.ContainsFunc(libs, func(purl string) bool {
		return strings.HasPrefix(purl, "pkg:deb/debian/dpkg@") && strings.HasSuffix(purl, "?arch="+runtime.GOARCH)
	})
	if _, err := exec.LookPath("dpkg-query"); err == nil && !hostDpkg {
		t.Errorf("the SBOM's libraries %v lack the Debian package dpkg, which /usr/bin/dpkg in the image comes from", libs)
	}

	for _, bad := range []struct {
		name, ref string
		files     map[string]map[string][]byte
		why       string
	}{
		{"old-" + testVersion + ".oci.tar", "docker.io/crust/old:v1.2.2", map[string]map[string][]byte{runtime.GOARCH: tools(prog)}, "not tagged " + testVersion},
		{"wrong-" + testVersion + ".oci.tar", "docker.io/crust/wrong:" + testVersion, map[string]map[string][]byte{other: tools(prog)}, "an ELF file for"},
	} {
		writeIndexArchive(t, filepath.Join(dir, bad.name), bad.ref, bad.files)
		if err := finish(dir, testVersion, nil); err == nil || !strings.Contains(err.Error(), bad.name) || !strings.Contains(err.Error(), bad.why) {
			t.Errorf("finish with %s: %v, want it refused by name, as %s", bad.name, err, bad.why)
		}
		if err := os.Remove(filepath.Join(dir, bad.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := finish(dir, testVersion, nil); err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("finish with notes.txt: %v, want it refused by name", err)
	}
}

// writeIndexArchive writes an oci-archive as hack/images -platforms does: one index named name holding,
// for each architecture of files, a linux image whose single layer holds its files (executable).
func writeIndexArchive(t *testing.T, file, name string, files map[string]map[string][]byte) {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, arch := range slices.Sorted(maps.Keys(files)) {
		var layer bytes.Buffer
		tw := tar.NewWriter(&layer)
		for p, data := range files[arch] {
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
