package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// node is one entry of a flattened filesystem read back from a tar stream.
type node struct {
	hdr  *tar.Header
	data []byte
}

// readTar returns the entries of a tar stream by clean path without the leading slash, and their order.
func readTar(t *testing.T, r io.Reader) (map[string]node, []string) {
	t.Helper()
	files := map[string]node{}
	var order []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, order
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		k := clean(h.Name)
		files[k] = node{hdr: h, data: data}
		order = append(order, k)
	}
}

// resolve follows the symlinks of p, component by component, inside files and returns the entry reached
// and its path, failing the test when a component is missing.
func resolve(t *testing.T, files map[string]node, p string) (node, string) {
	t.Helper()
	todo := strings.Split(clean(p), "/")
	cur := ""
	for hops := 0; len(todo) > 0; {
		name := todo[0]
		todo = todo[1:]
		next := path.Join(cur, name)
		n, ok := files[next]
		if !ok {
			t.Fatalf("resolve %s: /%s is not in the filesystem", p, next)
		}
		if n.hdr.Typeflag == tar.TypeSymlink {
			if hops++; hops > 40 {
				t.Fatalf("resolve %s: symlink loop", p)
			}
			target := n.hdr.Linkname
			if !path.IsAbs(target) {
				target = path.Join("/", cur, target)
			}
			todo = append(strings.Split(clean(target), "/"), todo...)
			cur = ""
			continue
		}
		cur = next
	}
	return files[cur], cur
}

// assertStaticELF fails unless data is an ELF executable without a program interpreter.
func assertStaticELF(t *testing.T, what string, data []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: not ELF: %v", what, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s: dynamically linked", what)
		}
	}
}

func TestImages(t *testing.T) {
	for _, tc := range []struct {
		short      string
		ref        string
		entrypoint []string
		needs      string // host file without which the test is skipped
		check      func(t *testing.T, files map[string]node)
	}{
		{
			short: "busybox", ref: "localhost/busybox:latest", entrypoint: []string{"/bin/sh"}, needs: "/bin/busybox",
			check: func(t *testing.T, files map[string]node) {
				sh, ok := files["bin/sh"]
				if !ok || sh.hdr.Typeflag != tar.TypeSymlink || sh.hdr.Linkname != "busybox" {
					t.Fatalf("/bin/sh is not a symlink to busybox: %+v", sh.hdr)
				}
				bb, p := resolve(t, files, "/bin/sh")
				if p != "bin/busybox" || bb.hdr.Typeflag != tar.TypeReg || bb.hdr.Mode&0o111 == 0 {
					t.Fatalf("/bin/sh resolves to %s (%+v), want the executable bin/busybox", p, bb.hdr)
				}
				assertStaticELF(t, "/bin/busybox", bb.data)
				if _, p := resolve(t, files, "/bin/ls"); p != "bin/busybox" {
					t.Fatalf("/bin/ls resolves to %s", p)
				}
			},
		},
		{ // one of crust's own images: named under -repo, tagged -tag, as deploy/ names them
			short: "crustd", ref: "crust/crustd:test", entrypoint: []string{"/usr/local/bin/crustd"},
			check: func(t *testing.T, files map[string]node) {
				for _, bin := range []string{"usr/local/bin/crustd", "usr/local/bin/crustctl"} {
					if f, ok := files[bin]; !ok || f.hdr.Typeflag != tar.TypeReg || f.hdr.Mode&0o111 == 0 {
						t.Fatalf("/%s is not an executable file: %+v", bin, f.hdr)
					}
				}
			},
		},
		{
			// The e2e suite's busybox: its shell is the host's bash and its dd the host's (oflag=nocache), so
			// that sh -c "dd ..." runs the host's dd.
			short: "e2e-busybox", ref: "localhost/e2e-test-images/busybox:1.37.0-2", entrypoint: []string{"/bin/sh"}, needs: "/bin/busybox",
			check: func(t *testing.T, files map[string]node) {
				if _, p := resolve(t, files, "/bin/sh"); p != "usr/bin/bash" {
					t.Errorf("/bin/sh resolves to %s, want usr/bin/bash", p)
				}
				if n, p := resolve(t, files, "/bin/dd"); p != "usr/bin/dd" || n.hdr.Typeflag != tar.TypeReg {
					t.Errorf("/bin/dd resolves to %s (%+v), want the host's dd", p, n.hdr)
				}
			},
		},
		{
			short: "pause", ref: "localhost/pause:3.10.2", entrypoint: []string{"/pause"},
			check: func(t *testing.T, files map[string]node) {
				p, ok := files["pause"]
				if !ok || p.hdr.Typeflag != tar.TypeReg || p.hdr.Mode != 0o755 {
					t.Fatalf("/pause is not an executable file: %+v", p.hdr)
				}
				assertStaticELF(t, "/pause", p.data)
			},
		},
	} {
		t.Run(tc.short, func(t *testing.T) {
			if tc.needs != "" {
				if _, err := os.Stat(tc.needs); err != nil {
					t.Skipf("host has no %s: %v", tc.needs, err)
				}
			}
			sel, err := selectSpecs([]string{tc.short})
			if err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			if err := run(out, "crust", "test", t.TempDir(), "", nil, nil, sel); err != nil {
				t.Fatal(err)
			}
			list, err := os.ReadFile(filepath.Join(out, "images.txt"))
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.short + ".tar " + tc.ref + "\n"; string(list) != want {
				t.Fatalf("images.txt = %q, want %q", list, want)
			}
			archive := filepath.Join(out, tc.short+".tar")
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(archive) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !reflect.DeepEqual(m[0].RepoTags, []string{tc.ref}) {
				t.Fatalf("manifest.json = %+v, want one image tagged %s", m, tc.ref)
			}
			img, err := tarball.ImageFromPath(archive, nil)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
			}
			if !reflect.DeepEqual(cf.Config.Entrypoint, tc.entrypoint) {
				t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, tc.entrypoint)
			}
			if !reflect.DeepEqual(cf.Config.Env, []string{defaultPath}) {
				t.Errorf("env %q, want %q", cf.Config.Env, defaultPath)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 1 {
				t.Fatalf("%d layers, want 1", len(layers))
			}
			rc := mutate.Extract(img)
			defer func() { _ = rc.Close() }()
			files, _ := readTar(t, rc)
			if tmp := files["tmp"]; tmp.hdr == nil || tmp.hdr.Typeflag != tar.TypeDir || tmp.hdr.Mode != 0o1777 {
				t.Errorf("/tmp is not a 1777 directory: %+v", tmp.hdr)
			}
			tc.check(t, files)
		})
	}
}

func TestHostToolLibraries(t *testing.T) {
	for _, tool := range []string{"blkid", "ldd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("host has no %s: %v", tool, err)
		}
	}
	tr := newTree()
	if err := tr.addRootLinks(); err != nil {
		t.Fatal(err)
	}
	if err := tr.addHostTool("blkid"); err != nil {
		t.Fatal(err)
	}
	b, err := tr.tar()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := readTar(t, bytes.NewReader(b))

	bin, err := exec.LookPath("blkid")
	if err != nil {
		t.Fatal(err)
	}
	realPath, err := filepath.EvalSymlinks(bin)
	if err != nil {
		t.Fatal(err)
	}
	if n, p := resolve(t, files, bin); p != clean(realPath) || n.hdr.Typeflag != tar.TypeReg || n.hdr.Mode&0o111 == 0 {
		t.Errorf("%s resolves to %s (%+v), want the executable %s", bin, p, n.hdr, realPath)
	}
	// The loader under the name executables ask for, and libblkid under its soname.
	loader, _ := resolve(t, files, "/lib64/ld-linux-x86-64.so.2")
	if loader.hdr.Typeflag != tar.TypeReg || len(loader.data) == 0 {
		t.Errorf("/lib64/ld-linux-x86-64.so.2 does not lead to the loader: %+v", loader.hdr)
	}
	var libblkid string
	for k, n := range files {
		if path.Base(k) == "libblkid.so.1" {
			libblkid = k
			if target, p := resolve(t, files, k); target.hdr.Typeflag != tar.TypeReg || len(target.data) == 0 {
				t.Errorf("%s resolves to %s (%+v), want a library", k, p, target.hdr)
			}
		}
		if n.hdr.Typeflag == tar.TypeReg && !strings.HasPrefix(k, "usr/") {
			t.Errorf("/%s is outside /usr on a merged-/usr layout", k)
		}
	}
	if libblkid == "" {
		t.Error("no libblkid.so.1 in the layer")
	}
}

func TestParseLdd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		want    []string
		wantErr bool
	}{
		{
			name: "dynamic",
			out: "\tlinux-vdso.so.1 (0x00007ffd)\n" +
				"\tlibblkid.so.1 => /lib/x86_64-linux-gnu/libblkid.so.1 (0x00007f01)\n" +
				"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n" +
				"\t/lib64/ld-linux-x86-64.so.2 (0x00007f03)\n",
			want: []string{"/lib/x86_64-linux-gnu/libblkid.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"},
		},
		{name: "missing", out: "\tlibfoo.so.1 => not found\n", wantErr: true},
		{name: "statically linked", out: "\tstatically linked\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLdd([]byte(tc.out))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTree(t *testing.T) {
	tr := newTree()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tr.symlink("/bin", "usr/bin"))
	must(tr.file("/usr/bin/b", 0o4755, []byte("b")))
	must(tr.file("/usr/bin/b", 0o4755, []byte("b"))) // the same again is fine
	must(tr.file("/usr-x/a", 0o644, []byte("a")))
	must(tr.dir("/tmp", 0o1777))
	if err := tr.file("/usr/bin/b", 0o755, []byte("other")); err == nil {
		t.Error("a different file at a taken path was accepted")
	}
	if err := tr.file("/bin/c", 0o755, nil); err == nil {
		t.Error("a file below a symlink was accepted")
	}
	b, err := tr.tar()
	if err != nil {
		t.Fatal(err)
	}
	files, order := readTar(t, bytes.NewReader(b))
	want := []string{"bin", "tmp", "usr", "usr-x", "usr-x/a", "usr/bin", "usr/bin/b"}
	if !reflect.DeepEqual(order, want) {
		t.Fatalf("order %q, want %q", order, want)
	}
	for k, n := range files {
		if n.hdr.Uid != 0 || n.hdr.Gid != 0 || !n.hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("/%s: owner %d:%d, mtime %v", k, n.hdr.Uid, n.hdr.Gid, n.hdr.ModTime)
		}
	}
	if m := files["usr/bin/b"].hdr.Mode; m != 0o4755 {
		t.Errorf("/usr/bin/b mode %o, want 4755", m)
	}
	if m := files["tmp"].hdr.Mode; m != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", m)
	}
	if h := files["usr"].hdr; h.Typeflag != tar.TypeDir || h.Mode != 0o755 {
		t.Errorf("/usr: %+v, want a 0755 directory", h)
	}
}

// With -platforms, an image is one OCI image index in an oci-archive, holding an image of each platform
// asked for, named as deploy/ names it; an image that carries host files is refused for a foreign
// architecture.
func TestImageIndexArchive(t *testing.T) {
	arches, err := parsePlatforms("linux/amd64,linux/arm64")
	if err != nil || !reflect.DeepEqual(arches, []string{"amd64", "arm64"}) {
		t.Fatalf("parsePlatforms: %v, %v", arches, err)
	}
	for _, bad := range []string{"linux/s390x", "amd64", "linux/amd64,linux/amd64"} {
		if _, err := parsePlatforms(bad); err == nil {
			t.Errorf("parsePlatforms(%q) accepted", bad)
		}
	}
	sel, err := selectSpecs([]string{"pause"})
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := run(out, "crust", "test", t.TempDir(), "", arches, nil, sel); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	untar := exec.Command("tar", "-xf", filepath.Join(out, "pause-3.10.2.oci.tar"), "-C", dir)
	if b, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, b)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["io.containerd.image.name"] != "localhost/pause:3.10.2" ||
		tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "3.10.2" {
		t.Fatalf("index.json: %+v, want one index named localhost/pause:3.10.2", tm.Manifests)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if d.Platform == nil || d.Platform.Architecture != cf.Architecture || cf.OS != "linux" {
			t.Errorf("manifest %s: platform %+v, config %s/%s", d.Digest, d.Platform, cf.OS, cf.Architecture)
		}
		got = append(got, cf.Architecture)
	}
	if !reflect.DeepEqual(got, arches) {
		t.Errorf("the index holds %v, want %v", got, arches)
	}

	foreign := "arm64"
	if runtime.GOARCH == "arm64" {
		foreign = "amd64"
	}
	sel, err = selectSpecs([]string{"busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t.TempDir(), "crust", "test", t.TempDir(), "", []string{foreign}, nil, sel); err == nil || !strings.Contains(err.Error(), "busybox") {
		t.Errorf("busybox for %s: %v, want it refused", foreign, err)
	}
}

// A sysroot's tool comes with its loader and the libraries its ELF files name, found in the sysroot's
// multiarch directory; an absolute symlink is followed within the sysroot, never out of it; and an ELF
// file of another machine than the sysroot's architecture is refused. The sysroot here is made of this
// machine's mount and the files ldd lists for it (Debian's arm64 packages need a network).
func TestSysrootTool(t *testing.T) {
	arch := runtime.GOARCH
	if _, ok := multiarch[arch]; !ok || runtime.GOOS != "linux" {
		t.Skipf("no multiarch directory known for %s", arch)
	}
	bin, err := exec.LookPath("mount")
	if err != nil {
		t.Skip("no mount here")
	}
	libs, err := sharedLibs(bin)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	place := func(at, from string) {
		t.Helper()
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, path.Dir(at)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, at), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	place("/bin/mount", bin)
	for _, lib := range libs {
		if strings.Contains(lib, "ld-linux") {
			place(lib, lib) // the loader, at the path the ELF file names, and in the multiarch directory as Debian has it
		}
		place(path.Join("/lib", multiarch[arch], path.Base(lib)), lib)
	}
	if err := os.Symlink("/bin/mount", filepath.Join(root, "bin", "mount-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(root, "bin", "outside")); err != nil {
		t.Fatal(err)
	}

	tree := newTree()
	r := sysroot{dir: root, arch: arch}
	if err := r.addTool(tree, "mount-link"); err != nil {
		t.Fatal(err)
	}
	want := []string{"bin/mount-link", "bin/mount", path.Join("lib", multiarch[arch], "libc.so.6")}
	for _, lib := range libs {
		if strings.Contains(lib, "ld-linux") {
			want = append(want, strings.TrimPrefix(lib, "/"))
		}
	}
	for _, p := range want {
		if _, ok := tree.entries[p]; !ok {
			t.Errorf("/%s is not in the image", p)
		}
	}
	if err := r.addTool(newTree(), "outside"); err == nil {
		t.Error("a symlink to /etc/hostname was followed out of the sysroot")
	}
	other := "arm64"
	if arch == "arm64" {
		other = "amd64"
	}
	if err := (sysroot{dir: root, arch: other}).addTool(newTree(), "mount"); err == nil || !strings.Contains(err.Error(), "not "+other) {
		t.Errorf("this machine's mount in a sysroot for %s: %v, want it refused", other, err)
	}
}
