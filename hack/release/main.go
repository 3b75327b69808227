// Command release finishes a release directory that `make release` filled with crust's image archives
// (hack/images -platforms: SHORT-vVERSION.oci.tar) and its packaged chart (crust-VERSION.tgz):
//
//	go run ./hack/release -dir _output/release
//
// It promises that, when it exits 0, the directory holds:
//
//   - the image archives and the chart, every file name carrying the version of the file VERSION;
//   - crust-vVERSION.cdx.json, an SBOM (CycloneDX 1.5 JSON) of every Go program in the images, one
//     component per program and platform, made from the build information Go wrote into the binary
//     (what `go version -m` prints), with the Go modules it links as components it depends on;
//   - SHA256SUMS, the SHA-256 of every other file, in the format `sha256sum -c` checks.
//
// It fails, naming the file, on a file whose name lacks the version, on an image archive it cannot
// read or whose image is not tagged with the version, and when the directory holds no image archive or
// no chart. It removes hack/images' images.txt,
// which is not a release artifact.
package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// repoRootFromMake is the repository's root as seen from where `make release` runs this command.
const repoRootFromMake = "."

func main() {
	dir := flag.String("dir", "_output/release", "the release directory to finish")
	root := flag.String("root", repoRootFromMake, "the repository's root, where the file VERSION is")
	flag.Parse()
	version, err := readVersion(*root)
	if err == nil {
		err = finish(*dir, version)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// Names of what finish writes.
const (
	sumsFile   = "SHA256SUMS"
	imagesList = "images.txt" // hack/images' list, not an artifact
)

// sbomName is the SBOM's file name for version.
func sbomName(version string) string { return "crust-" + version + ".cdx.json" }

// finish writes the SBOM and SHA256SUMS into dir, as the command's documentation says.
func finish(dir, version string) error {
	if err := os.Remove(filepath.Join(dir, imagesList)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	bare := strings.TrimPrefix(version, "v") // the chart's version has no v
	var archives, charts []string
	for _, e := range entries {
		n := e.Name()
		switch {
		case n == sumsFile || n == sbomName(version):
			continue // written again below
		case !e.Type().IsRegular():
			return fmt.Errorf("%s: not a regular file", filepath.Join(dir, n))
		case !strings.Contains(n, bare):
			return fmt.Errorf("%s: the file name does not carry the version %s", filepath.Join(dir, n), version)
		case strings.HasSuffix(n, ".oci.tar"):
			archives = append(archives, n)
		case strings.HasSuffix(n, ".tgz"):
			charts = append(charts, n)
		}
	}
	if len(archives) == 0 || len(charts) == 0 {
		return fmt.Errorf("%s: %d image archives and %d charts, want at least one of each", dir, len(archives), len(charts))
	}
	var programs []program
	for _, a := range archives {
		p, err := programsOf(filepath.Join(dir, a))
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, a), err)
		}
		for _, prog := range p {
			if !strings.HasSuffix(prog.image, ":"+version) {
				return fmt.Errorf("%s: the image is named %s, not tagged %s", filepath.Join(dir, a), prog.image, version)
			}
		}
		programs = append(programs, p...)
	}
	if len(programs) == 0 {
		return fmt.Errorf("%s: the images hold no Go program", dir)
	}
	sbom, err := json.MarshalIndent(cycloneDX(version, programs), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, sbomName(version)), append(sbom, '\n'), 0o644); err != nil {
		return err
	}
	return writeSums(dir)
}

// writeSums writes dir/SHA256SUMS: one line "<hex SHA-256>  <name>" per other regular file, by name.
func writeSums(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var sums bytes.Buffer
	for _, e := range entries {
		if e.Name() == sumsFile || !e.Type().IsRegular() {
			continue
		}
		sum, err := fileSHA256(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		fmt.Fprintf(&sums, "%s  %s\n", sum, e.Name())
	}
	return os.WriteFile(filepath.Join(dir, sumsFile), sums.Bytes(), 0o644)
}

// fileSHA256 is the lowercase hex SHA-256 of the file p.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// program is one Go program found in an image.
type program struct {
	image    string // the image's name (io.containerd.image.name)
	platform string // os/arch
	path     string // its path in the image
	info     *buildinfo.BuildInfo
}

// readVersion returns the version the file VERSION under root holds: one line, vMAJOR.MINOR.PATCH with
// an optional pre-release suffix (v0.2.0, v0.2.0-dev).
func readVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return "", err
	}
	v := strings.TrimSuffix(string(b), "\n")
	if !versionSyntax.MatchString(v) {
		return "", fmt.Errorf("VERSION: %q is not one line vMAJOR.MINOR.PATCH[-PRERELEASE]", v)
	}
	return v, nil
}

var versionSyntax = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// sortPrograms orders programs by image, platform and path.
func sortPrograms(ps []program) {
	slices.SortFunc(ps, func(a, b program) int {
		return strings.Compare(a.image+" "+a.platform+" "+a.path, b.image+" "+b.platform+" "+b.path)
	})
}
