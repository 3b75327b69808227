// Command release finishes a release directory that `make release` filled with crust's image archives
// (hack/images -platforms: SHORT-vVERSION.oci.tar) and its packaged chart (crust-VERSION.tgz):
//
//	go run ./hack/release -dir _output/release
//
// It promises that, when it exits 0, the directory holds:
//
//   - the image archives and the chart, every file name carrying the version of the file VERSION;
//   - crust-vVERSION.cdx.json, an SBOM (CycloneDX 1.5 JSON) of the images: one component per image and
//     platform; one per Go program in it, made from the build information Go wrote into the binary
//     (what `go version -m` prints), with the Go modules it links as components it depends on; and the
//     Debian packages that the image's other files (host tools, their libraries) come from: as this
//     machine's dpkg knows them for an image of its architecture (none where dpkg is not installed),
//     as the sysroot's files list says for another (-packages ARCH=FILE);
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
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
)

// repoRootFromMake is the repository's root as seen from where `make release` runs this command.
const repoRootFromMake = "."

func main() {
	dir := flag.String("dir", "_output/release", "the release directory to finish")
	root := flag.String("root", repoRootFromMake, "the repository's root, where the file VERSION is")
	lists := flag.String("packages", "", "comma-separated ARCH=FILE: the files list hack/images/sysroot.sh wrote for the sysroot that the images for ARCH took their host tools from")
	flag.Parse()
	version, err := readVersion(*root)
	var packageLists map[string]string
	if err == nil {
		packageLists, err = parseLists(*lists)
	}
	if err == nil {
		err = finish(*dir, version, packageLists)
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

// finish writes the SBOM and SHA256SUMS into dir, as the command's documentation says. packageLists are
// the files lists (hack/images/sysroot.sh) of the sysroots, by GOARCH, that the host files of the images
// of another architecture than this machine's came from.
func finish(dir, version string, packageLists map[string]string) error {
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
	var (
		images    []imageContent
		programs  int
		hostFiles []string // of the images of this machine's architecture
	)
	for _, a := range archives {
		cs, err := contentsOf(filepath.Join(dir, a))
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, a), err)
		}
		for _, c := range cs {
			if !strings.HasSuffix(c.image, ":"+version) {
				return fmt.Errorf("%s: the image is named %s, not tagged %s", filepath.Join(dir, a), c.image, version)
			}
			programs += len(c.programs)
			if c.platform == "linux/"+runtime.GOARCH {
				hostFiles = append(hostFiles, c.files...)
			}
		}
		images = append(images, cs...)
	}
	if programs == 0 {
		return fmt.Errorf("%s: the images hold no Go program", dir)
	}
	debs := map[string]map[string]deb{} // by platform, by path
	if debs["linux/"+runtime.GOARCH], err = debPackages(hostFiles); err != nil {
		return err
	}
	for arch, list := range packageLists {
		if arch == runtime.GOARCH {
			return fmt.Errorf("-packages %s=%s: this machine's packages are dpkg's to say", arch, list)
		}
		if debs["linux/"+arch], err = readPackageList(list); err != nil {
			return err
		}
	}
	sbom, err := json.MarshalIndent(cycloneDX(version, images, debs), "", "  ")
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

// A release is built on the machine that runs this command, so the host files in its images are this
// machine's: dpkg says which package each came from.

// deb is a Debian package installed here.
type deb struct{ name, arch, version string }

// debPackages returns the Debian package each of paths (files in an image, copied from this machine at
// their real /usr paths, which dpkg may know under the path without /usr) came from, by path; a path dpkg
// does not know is left out, and so is everything when dpkg-query is not installed.
func debPackages(paths []string) (map[string]deb, error) {
	if _, err := exec.LookPath("dpkg-query"); err != nil || len(paths) == 0 {
		return nil, nil //nolint:nilerr // no dpkg: no packages to name
	}
	owner := map[string]string{} // path -> package:arch
	for _, p := range slices.Compact(slices.Sorted(slices.Values(paths))) {
		for _, q := range []string{p, strings.TrimPrefix(p, "/usr")} {
			out, err := exec.Command("dpkg-query", "-S", q).Output()
			if err != nil {
				continue // not this path: dpkg-query exits 1
			}
			if pkg, _, ok := strings.Cut(strings.SplitN(string(out), "\n", 2)[0], ": "); ok {
				owner[p] = strings.Split(pkg, ", ")[0]
				break
			}
		}
	}
	versions := map[string]deb{}
	for _, pkg := range owner {
		if _, ok := versions[pkg]; ok {
			continue
		}
		out, err := exec.Command("dpkg-query", "-W", "-f", "${Package} ${Architecture} ${Version}", pkg).Output()
		if err != nil {
			return nil, fmt.Errorf("dpkg-query -W %s: %w", pkg, err)
		}
		f := strings.Fields(string(out))
		if len(f) != 3 {
			return nil, fmt.Errorf("dpkg-query -W %s: %q is not NAME ARCH VERSION", pkg, out)
		}
		versions[pkg] = deb{f[0], f[1], f[2]}
	}
	byPath := map[string]deb{}
	for p, pkg := range owner {
		byPath[p] = versions[pkg]
	}
	return byPath, nil
}

// parseLists parses -packages: comma-separated ARCH=FILE, none for "".
func parseLists(s string) (map[string]string, error) {
	lists := map[string]string{}
	if s == "" {
		return lists, nil
	}
	for _, kv := range strings.Split(s, ",") {
		arch, file, ok := strings.Cut(kv, "=")
		if !ok || arch == "" || file == "" {
			return nil, fmt.Errorf("-packages: %q is not ARCH=FILE", kv)
		}
		lists[arch] = file
	}
	return lists, nil
}

// readPackageList reads a sysroot's files list, one line "PATH PACKAGE ARCH VERSION" per regular file
// its packages hold, into the package of each path.
func readPackageList(file string) (map[string]deb, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]deb{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || !strings.HasPrefix(f[0], "/") {
			return nil, fmt.Errorf("%s:%d: %q is not PATH PACKAGE ARCH VERSION", file, i+1, line)
		}
		out[f[0]] = deb{name: f[1], arch: f[2], version: f[3]}
	}
	return out, nil
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
