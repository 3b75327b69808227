// Command images builds crust's container images and the few it needs from elsewhere as image
// archives, with go-containerregistry and without a registry or Docker:
//
//	go run ./hack/images [-out _output/images] [-repo localhost/crust] [-tag dev] [-version V] [-k8s-bin _output/k8s/bin]
//	    [-platforms linux/amd64,linux/arm64] [SHORT...]
//
// It promises, for each image (all of them, or the short names given):
//
//   - OUT/SHORT.tar, a docker-archive tarball (manifest.json with RepoTags) holding one linux/amd64
//     image with a single layer, which `ctr -n k8s.io images import OUT/SHORT.tar` imports under the
//     reference below;
//   - a deterministic layer: entries sorted, directories before their contents, owner 0:0, mtime 0, the
//     host files' modes kept; every image has /tmp (1777), /run, /etc, /dev, /proc, /sys, /var/lib and
//     PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin;
//   - Go programs built with CGO_ENABLED=0 GOOS=linux GOARCH=amd64 -trimpath -ldflags "-s -w";
//   - host tools copied from this machine with the shared libraries and loader ldd lists, each at its
//     real /usr path with the host's symlinks to it (mkfs.ext4 -> mke2fs) and the merged-/usr root
//     symlinks (bin -> usr/bin, sbin, lib, lib64);
//
// With -platforms, each image is instead built for every platform named and written as one OCI image
// index to OUT/SHORT-TAG.oci.tar (an OCI image layout in a tar archive, which `ctr images import` and
// skopeo's oci-archive: read), its Go programs built for each architecture. An image that carries host
// tools can be built for another architecture than this machine's only from a sysroot of that
// architecture (-sysroot ARCH=DIR, which hack/images/sysroot.sh makes from Debian's packages): the
// tools, their loader and libraries (found from the ELF files) are copied from there. Without one, and
// always for busybox, it fails, saying so.
//
// It writes OUT/images.txt, one line "ARCHIVE REF" per image built by this run, ARCHIVE being the archive's
// file name in OUT. It prints "REF ARCHIVE SIZE MiB" per image, and exits non-zero, naming the images
// that failed, when any did (the others are still written and listed).
//
// The images (REPO is -repo, TAG is -tag; `make images` gives the repository and tag deploy/ names):
//
//	crustd           REPO/crustd:TAG                           /usr/local/bin/crustd, crustctl
//	crust-csi-proxy  REPO/crust-csi-proxy:TAG                  /usr/local/bin/crust-csi-proxy, the mount tools
//	crust-lvm-csi    REPO/crust-lvm-csi:TAG                    /usr/local/bin/crust-lvm-csi, the mount tools, lvm
//	csi-registrar    REPO/csi-registrar:TAG                    /usr/local/bin/crust-test-registrar
//	csi-provisioner  localhost/sig-storage/csi-provisioner:v6.4.0  /csi-provisioner from -k8s-bin
//	csi-resizer      localhost/sig-storage/csi-resizer:v2.3.0      /csi-resizer from -k8s-bin
//	busybox          localhost/busybox:latest                  /bin/busybox (busybox-static), /bin/APPLET links
//	pause            localhost/pause:3.10.2                    /pause (hack/images/pause)
//
// The mount tools are mount, umount, blkid, blockdev, losetup, fsck, e2fsck, fsck.ext3, fsck.ext4,
// xfs_repair, mkfs.ext3, mkfs.ext4, mkfs.xfs, resize2fs and xfs_growfs, with /etc/mke2fs.conf.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	out := flag.String("out", "_output/images", "directory to write the archives and images.txt to")
	repo := flag.String("repo", "localhost/crust", "repository prefix of crust's own images")
	tag := flag.String("tag", "dev", "tag of crust's own images")
	version := flag.String("version", "", `version stamped into crust's binaries (api/version); "" leaves them "devel" with their VCS revision`)
	k8sBin := flag.String("k8s-bin", "_output/k8s/bin", "directory with the csi-provisioner and csi-resizer binaries")
	sysroots := flag.String("sysroot", "", `comma-separated ARCH=DIR: the root filesystem (Debian packages of ARCH unpacked, hack/images/sysroot.sh) that host tools of images for ARCH, not this machine's, come from`)
	platforms := flag.String("platforms", "", `comma-separated platforms, such as linux/amd64,linux/arm64, to build each image for, into one OCI image index archive OUT/SHORT-TAG.oci.tar; "" writes a linux/amd64 docker archive OUT/SHORT.tar`)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: images [flags] [%s]\n", strings.Join(shortNames(), " | "))
		flag.PrintDefaults()
	}
	flag.Parse()
	selected, err := selectSpecs(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(2)
	}
	arches, err := parsePlatforms(*platforms)
	if err != nil {
		fmt.Fprintln(os.Stderr, "images: -platforms:", err)
		os.Exit(2)
	}
	roots, err := parseSysroots(*sysroots)
	if err != nil {
		fmt.Fprintln(os.Stderr, "images: -sysroot:", err)
		os.Exit(2)
	}
	if err := run(*out, *repo, *tag, *k8sBin, *version, arches, roots, selected); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// shortNames returns the images' short names in build order.
func shortNames() []string {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.short
	}
	return names
}

// selectSpecs returns the specs named (all when none is), in build order.
func selectSpecs(names []string) ([]*spec, error) {
	want := map[string]bool{}
	for _, n := range names {
		found := false
		for _, s := range specs {
			found = found || s.short == n
		}
		if !found {
			return nil, fmt.Errorf("unknown image %q (known: %s)", n, strings.Join(shortNames(), ", "))
		}
		want[n] = true
	}
	var sel []*spec
	for i := range specs {
		if len(names) == 0 || want[specs[i].short] {
			sel = append(sel, &specs[i])
		}
	}
	return sel, nil
}

// platformArches are the platforms -platforms accepts, and the GOARCH each builds for.
var platformArches = map[string]string{"linux/amd64": "amd64", "linux/arm64": "arm64"}

// parsePlatforms returns the GOARCH of each platform of the comma-separated list s, in its order; none
// for an empty s.
func parsePlatforms(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var arches []string
	for _, p := range strings.Split(s, ",") {
		arch, ok := platformArches[p]
		if !ok {
			return nil, fmt.Errorf("%q is not a platform built here (linux/amd64, linux/arm64)", p)
		}
		if slices.Contains(arches, arch) {
			return nil, fmt.Errorf("%q is named twice", p)
		}
		arches = append(arches, arch)
	}
	return arches, nil
}

// run builds the selected images into out and writes out/images.txt listing those that succeeded: a
// docker archive each when arches is empty, else an OCI image index archive each of those architectures.
func run(out, repo, tag, k8sBin, version string, arches []string, sysroots map[string]sysroot, selected []*spec) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, err := newBuilder(k8sBin, version, sysroots)
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(b.work) }()
	var list, failed []string
	for _, s := range selected {
		ref := s.ref(repo, tag)
		file := filepath.Join(out, s.short+".tar")
		build := func() error { return b.build(s, ref, file) }
		if len(arches) > 0 {
			file = filepath.Join(out, s.short+"-"+ref[strings.LastIndex(ref, ":")+1:]+".oci.tar")
			build = func() error { return b.buildIndex(s, ref, file, arches) }
		}
		if err := build(); err != nil {
			fmt.Fprintf(os.Stderr, "images: %s (%s): %v\n", s.short, ref, err)
			failed = append(failed, s.short)
			continue
		}
		fi, err := os.Stat(file)
		if err != nil {
			return err
		}
		fmt.Printf("%-46s %s %6.1f MiB\n", ref, file, float64(fi.Size())/(1<<20))
		list = append(list, filepath.Base(file)+" "+ref+"\n")
	}
	if err := os.WriteFile(filepath.Join(out, "images.txt"), []byte(strings.Join(list, "")), 0o644); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d images failed: %s", len(failed), len(selected), strings.Join(failed, ", "))
	}
	return nil
}
