package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// mountTools are the host commands the CSI proxy and the reference driver run: what k8s.io/mount-utils'
// SafeFormatAndMount execs (mount, umount, blkid, fsck -a with its fsck.<type>, mkfs.<type>) and
// ResizeFs execs (blockdev --getsize64/--getro, resize2fs, xfs_growfs), for ext3, ext4 and xfs, plus
// e2fsck, xfs_repair and losetup. fsck.xfs is left out: it is a shell script that does nothing, and
// mount-utils only logs fsck's failure to find it.
var mountTools = []string{
	"mount", "umount", "blkid", "blockdev", "losetup",
	"fsck", "e2fsck", "fsck.ext3", "fsck.ext4", "xfs_repair",
	"mkfs.ext3", "mkfs.ext4", "mkfs.xfs",
	"resize2fs", "xfs_growfs",
}

// spec is one image: its archive's short name, its reference and how its filesystem is made.
type spec struct {
	short      string
	repo       string // reference without the tag; for crust's own images, the name under -repo
	tag        string // fixed tag; empty means the -tag flag (crust's own images)
	entrypoint []string
	fill       func(b *builder, t *fsTree) error
}

// sigStorage is the image localhost/sig-storage/BIN:VERSION of a Kubernetes sig-storage sidecar: the
// prebuilt static binary BIN of that version from -k8s-bin (builder.prebuilt), at /BIN and run as the
// entrypoint.
func sigStorage(bin, version string) spec {
	return spec{
		short: bin, repo: "localhost/sig-storage/" + bin, tag: version,
		entrypoint: []string{"/" + bin},
		fill: func(b *builder, t *fsTree) error {
			return b.prebuilt(t, bin, version)
		},
	}
}

// specs are the images, in the order they are built.
var specs = []spec{
	{
		short: "crustd", repo: "crustd",
		entrypoint: []string{"/usr/local/bin/crustd"},
		fill: func(b *builder, t *fsTree) error {
			return b.goBinaries(t, "/usr/local/bin", "./cmd/crustd", "./cmd/crustctl")
		},
	},
	{
		short: "crust-csi-proxy", repo: "crust-csi-proxy",
		entrypoint: []string{"/usr/local/bin/crust-csi-proxy"},
		fill: func(b *builder, t *fsTree) error {
			if err := b.goBinaries(t, "/usr/local/bin", "./cmd/crust-csi-proxy"); err != nil {
				return err
			}
			return b.hostTools(t, mountTools...)
		},
	},
	{
		short: "crust-lvm-csi", repo: "crust-lvm-csi",
		entrypoint: []string{"/usr/local/bin/crust-lvm-csi"},
		fill: func(b *builder, t *fsTree) error {
			if err := b.goBinaries(t, "/usr/local/bin", "./examples/lvm-csi/cmd/crust-lvm-csi"); err != nil {
				return err
			}
			return b.hostTools(t, append([]string{"lvm"}, mountTools...)...)
		},
	},
	{
		short: "csi-registrar", repo: "csi-registrar",
		entrypoint: []string{"/usr/local/bin/crust-test-registrar"},
		fill: func(b *builder, t *fsTree) error {
			return b.goBinaries(t, "/usr/local/bin", "./test/cluster/cmd/crust-test-registrar")
		},
	},
	sigStorage("csi-provisioner", "v6.4.0"),
	sigStorage("csi-resizer", "v2.3.0"),
	{
		short: "busybox", repo: "localhost/busybox", tag: "latest",
		entrypoint: []string{"/bin/sh"},
		fill: func(b *builder, t *fsTree) error {
			return b.busybox(t, "/bin/busybox", "/bin")
		},
	},
	{
		// The node's sandbox image (hack/cluster/up.sh), under the name the e2e suite gives it too.
		short: "pause", repo: "localhost/pause", tag: "3.10.2",
		entrypoint: []string{"/pause"},
		fill: func(b *builder, t *fsTree) error {
			return b.goBinaries(t, "/", "./hack/images/pause")
		},
	},
	// The images Kubernetes' storage e2e suite runs (make conformance), under the names e2e.test gives
	// them with its registries remapped to localhost (test/conformance/repo-list.yaml).
	{
		// Busybox, with the host's dd: the suite writes with oflag=nocache, which busybox's dd lacks.
		short: "e2e-busybox", repo: "localhost/e2e-test-images/busybox", tag: "1.37.0-2",
		entrypoint: []string{"/bin/sh"},
		fill:       func(b *builder, t *fsTree) error { return b.e2eTools(t) },
	},
	{
		// The suite's exec test runs a shell script, not nginx, in its nginx image; busybox serves.
		short: "e2e-nginx", repo: "localhost/e2e-test-images/nginx", tag: "1.27.0-2",
		entrypoint: []string{"/bin/sh"},
		fill:       func(b *builder, t *fsTree) error { return b.e2eTools(t) },
	},
	{
		// The suite's multi-volume tests read raw block devices with this image's tools; busybox with
		// the host's dd serves.
		short: "e2e-glibc-dns", repo: "localhost/e2e-test-images/glibc-dns-testing", tag: "2.1.1",
		entrypoint: []string{"/bin/sh"},
		fill:       func(b *builder, t *fsTree) error { return b.e2eTools(t) },
	},
	{
		// agnhost from the release's source, with busybox and the host's nsenter (the suite's host-exec
		// pods enter the node's mount namespace with it).
		short: "agnhost", repo: "localhost/e2e-test-images/agnhost", tag: "2.66.1",
		entrypoint: []string{"/agnhost"},
		fill: func(b *builder, t *fsTree) error {
			if err := b.prebuilt(t, "agnhost", "2.66.1"); err != nil {
				return err
			}
			return b.e2eTools(t)
		},
	},
}

// e2eHostTools are the host commands the e2e images carry instead of busybox's applets.
var e2eHostTools = []string{"dd", "nsenter", "bash"}

// e2eTools fills the tools of the e2e images: e2eHostTools, the host's bash as sh, and busybox for the
// rest. The shell cannot be busybox's: a static busybox's sh runs its own applets before anything on
// PATH, so the suite's `sh -c "... | dd oflag=nocache"` got busybox's dd, which lacks nocache. Nor can
// it be dash: the suite's scripts use `let`.
func (b *builder) e2eTools(t *fsTree) error {
	if err := b.hostTools(t, e2eHostTools...); err != nil {
		return err
	}
	if err := t.symlink("/usr/bin/sh", "bash"); err != nil {
		return err
	}
	return b.busybox(t, "/bin/busybox", "/usr/bin", append(slices.Clone(e2eHostTools), "sh")...)
}

// ref returns the image's reference: for crust's own images (no fixed tag), repo/NAME:tag.
func (s *spec) ref(repo, tag string) string {
	if s.tag != "" {
		return s.repo + ":" + s.tag
	}
	return repo + "/" + s.repo + ":" + tag
}

// builder holds what building the images needs.
type builder struct {
	modRoot string // the crust module's directory, where go build runs
	k8sBin  string // directory with the prebuilt sidecar binaries
	work    string // scratch directory for the Go builds
	version string // stamped into api/version; "" leaves it unstamped
	arch    string // the GOARCH the image is for: its Go programs are built for it
	// sysroots, by GOARCH, are where an image of another architecture than this machine's takes its
	// host tools from.
	sysroots map[string]sysroot
}

// newBuilder finds the module root from the working directory (go env GOMOD) and makes a scratch
// directory; the caller removes b.work.
func newBuilder(k8sBin, version string, sysroots map[string]sysroot) (*builder, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return nil, fmt.Errorf("not inside the crust module (go env GOMOD is empty)")
	}
	work, err := os.MkdirTemp("", "crust-images-")
	if err != nil {
		return nil, err
	}
	return &builder{modRoot: filepath.Dir(gomod), k8sBin: k8sBin, work: work, version: version, arch: "amd64", sysroots: sysroots}, nil
}

// build makes the linux/amd64 image of s, tagged ref, and writes it to the docker archive file.
func (b *builder) build(s *spec, ref, file string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	img, err := b.image(s, false)
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// image makes the image of s for b.arch, with OCI media types when oci is set (else Docker's).
func (b *builder) image(s *spec, oci bool) (v1.Image, error) {
	t := newTree()
	if err := t.skeleton(); err != nil {
		return nil, err
	}
	if err := s.fill(b, t); err != nil {
		return nil, err
	}
	return t.image(s.entrypoint, b.arch, oci)
}

// buildIndex makes the image of s for each of arches (GOARCH names, all linux) and writes them, as one
// OCI image index named ref, to file: an OCI image layout in a tar archive (an oci-archive), whose
// index.json points at the index with the annotations org.opencontainers.image.ref.name (the tag) and
// io.containerd.image.name (ref), as `ctr images import` and skopeo's oci-archive: read it.
func (b *builder) buildIndex(s *spec, ref, file string, arches []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	var adds []mutate.IndexAddendum
	for _, arch := range arches {
		ab := *b
		ab.arch = arch
		img, err := ab.image(s, true)
		if err != nil {
			return fmt.Errorf("linux/%s: %w", arch, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: arch},
		}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	dir, err := os.MkdirTemp(b.work, "layout-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          containerdName(tag),
	})); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := tarDir(dir, tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, file)
}

// containerdName is the name containerd gives tag: Docker Hub's registry as docker.io.
func containerdName(tag name.Tag) string {
	if tag.RegistryStr() == name.DefaultRegistry {
		return "docker.io/" + tag.RepositoryStr() + ":" + tag.TagStr()
	}
	return tag.Name()
}

// foreignArch is the error for host files that an image for b.arch cannot carry, or nil when the image
// is for this machine's architecture.
func (b *builder) foreignArch(what string) error {
	if b.arch == runtime.GOARCH {
		return nil
	}
	return fmt.Errorf("%s come from this %s machine: an image for %s cannot carry them (give -sysroot %s=DIR)", what, runtime.GOARCH, b.arch, b.arch)
}

// goBinaries builds the main packages pkgs (paths relative to the module root) statically for
// linux/b.arch, stripped and trimmed, and adds each to the tree in dir, named as go build names it.
func (b *builder) goBinaries(t *fsTree, dir string, pkgs ...string) error {
	for _, pkg := range pkgs {
		if _, err := os.Stat(filepath.Join(b.modRoot, pkg)); err != nil {
			return fmt.Errorf("package %s does not exist (yet): %w", pkg, err)
		}
	}
	out, err := os.MkdirTemp(b.work, "bin-")
	if err != nil {
		return err
	}
	ldflags := "-s -w"
	if b.version != "" {
		ldflags += " -X crust.dev/crust/api/version.version=" + b.version
	}
	args := append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", out + "/"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = b.modRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+b.arch)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = os.Stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, strings.TrimSpace(stderr.String()))
	}
	for _, pkg := range pkgs {
		bin := path.Base(pkg)
		data, err := os.ReadFile(filepath.Join(out, bin))
		if err != nil {
			return err
		}
		if err := t.file(path.Join(dir, bin), 0o755, data); err != nil {
			return err
		}
	}
	return nil
}

// prebuilt adds the static binary bin from the -k8s-bin directory at /bin. When hack/cluster/build.sh's
// version stamp (.bin.version) is there, it must name version, the image's tag.
func (b *builder) prebuilt(t *fsTree, bin, version string) error {
	src := filepath.Join(b.k8sBin, bin)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("%w (hack/cluster/build.sh builds it)", err)
	}
	if stamp, err := os.ReadFile(filepath.Join(b.k8sBin, "."+bin+".version")); err == nil {
		if v := strings.TrimSpace(string(stamp)); v != version {
			return fmt.Errorf("%s is %s (its version stamp), the image is tagged %s", src, v, version)
		}
	}
	static, err := isStatic(src)
	if err != nil {
		return err
	}
	if !static {
		return fmt.Errorf("%s is dynamically linked; the image has no libraries", src)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return t.file("/"+bin, 0o755, data)
}

// hostTools adds each host command with its libraries (addHostTool), the merged-/usr root symlinks and,
// when the host has it, /etc/mke2fs.conf (mke2fs reads it). For an image of another architecture than
// this machine's, the tools and /etc/mke2fs.conf come from its sysroot (sysroot.addTool), and without
// one it fails.
func (b *builder) hostTools(t *fsTree, names ...string) error {
	if r, ok := b.sysroots[b.arch]; ok && b.arch != runtime.GOARCH {
		for _, n := range names {
			if err := r.addTool(t, n); err != nil {
				return err
			}
		}
		if _, err := os.Lstat(filepath.Join(r.dir, "etc", "mke2fs.conf")); err == nil {
			_, err = r.add(t, "/etc/mke2fs.conf")
			return err
		}
		return nil
	}
	if err := b.foreignArch("the host tools " + strings.Join(names, ", ")); err != nil {
		return err
	}
	if err := t.addRootLinks(); err != nil {
		return err
	}
	for _, n := range names {
		if err := t.addHostTool(n); err != nil {
			return err
		}
	}
	if _, err := os.Stat("/etc/mke2fs.conf"); err == nil {
		if _, err := t.addHost("/etc/mke2fs.conf"); err != nil {
			return err
		}
	}
	return nil
}

// busybox adds the static busybox at src as DIR/busybox and a symlink DIR/APPLET -> busybox for each
// applet it lists (busybox --list), but those named in except. It fails for an image of another
// architecture than this machine's.
func (b *builder) busybox(t *fsTree, src, dir string, except ...string) error {
	if err := b.foreignArch("busybox and its applets"); err != nil {
		return err
	}
	static, err := isStatic(src)
	if err != nil {
		return fmt.Errorf("%w (install busybox-static)", err)
	}
	if !static {
		return fmt.Errorf("%s is dynamically linked: install busybox-static", src)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := t.file(dir+"/busybox", tarMode(fi.Mode()), data); err != nil {
		return err
	}
	out, err := exec.Command(src, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", src, err)
	}
	applets := strings.Fields(string(out))
	if len(applets) == 0 {
		return fmt.Errorf("%s --list printed no applets", src)
	}
	for _, a := range applets {
		if a == "busybox" || strings.Contains(a, "/") || slices.Contains(except, a) {
			continue
		}
		if err := t.symlink(dir+"/"+a, "busybox"); err != nil {
			return err
		}
	}
	return nil
}
