// Package ctrdtest runs a private containerd (the machine's /usr/bin/containerd, Debian's 1.6, or the one
// $CRUST_CONTAINERD_DIR holds) for the tiers that drive crust-microvm's containerd shim
// (containerd-shim-crust-microvm-v1) through ctr: the e2e tests and the benchmarks. containerd gets its own root, state, socket and config, the shim found on
// PATH with its settings in the environment, and the shim's state directory under the test's temp
// directory; images are built here (go-containerregistry) and imported with ctr, so nothing is pulled.
package ctrdtest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/testutil/harness"
)

// DirEnv names a directory holding a containerd and ctr to run instead of the machine's (make
// test-containerd2 builds containerd 2.x there).
const DirEnv = "CRUST_CONTAINERD_DIR"

// Bin is containerd's binary: the machine's (Debian's), or $CRUST_CONTAINERD_DIR/containerd.
func Bin() string { return tool("containerd", "/usr/bin/containerd") }

// Ctr is ctr's binary, from the same place as Bin.
func Ctr() string { return tool("ctr", "ctr") }

func tool(name, def string) string {
	if d := os.Getenv(DirEnv); d != "" {
		return filepath.Join(d, name)
	}
	return def
}

// Runtime is the shim's runtime name, for ctr run --runtime.
const Runtime = "io.containerd.crust-microvm.v1"

// Config says how to start containerd and the shim.
type Config struct {
	// ShimDir holds containerd-shim-crust-microvm-v1 (put first on containerd's PATH).
	ShimDir string
	// CrustSocket, KubeletDir and Assets are crustd's socket, its kubelet directory and the guest assets.
	CrustSocket, KubeletDir, Assets string
	// Env is more of the shim's environment (NAME=value).
	Env []string
}

// Containerd is a private containerd: its own root, state, socket and the shim's state directory.
type Containerd struct {
	Socket, StateDir, Log string
	// Pid is containerd's process id.
	Pid int
}

// Start starts containerd on temp dirs with the shim on PATH and its settings in the environment, and
// waits until it serves; it is stopped at the test's cleanup.
func Start(t testing.TB, cfg Config) *Containerd {
	t.Helper()
	dir := t.TempDir()
	c := &Containerd{Socket: filepath.Join(dir, "c.sock"), StateDir: filepath.Join(dir, "vm"), Log: filepath.Join(dir, "containerd.log")}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  level = "debug"
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.Socket, c.Socket+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(c.Log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(Bin(), "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PATH="+cfg.ShimDir+":"+os.Getenv("PATH"), "CRUST_SOCKET="+cfg.CrustSocket,
		"CRUST_MICROVM_ASSETS="+cfg.Assets, "CRUST_MICROVM_STATE_DIR="+c.StateDir, "CRUST_MICROVM_ACCEL=tcg", "CRUST_KUBELET_DIR="+cfg.KubeletDir)
	cmd.Env = append(cmd.Env, cfg.Env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.Pid = cmd.Process.Pid
	t.Cleanup(func() {
		_ = cmd.Process.Signal(unix.SIGTERM)
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			t.Logf("containerd's log:\n%s", c.LogTail())
		}
	})
	t0 := time.Now()
	harness.Eventually(t, time.Minute, "containerd to serve", func() bool {
		return exec.Command(Ctr(), c.Args("version")...).Run() == nil
	})
	took := time.Since(t0)
	v, _ := exec.Command(Ctr(), c.Args("version")...).Output()
	t.Logf("containerd serving after %s: %s", took.Round(time.Millisecond), strings.Join(strings.Fields(string(v)), " "))
	return c
}

// Args are ctr's arguments for c (its address and namespace) followed by args.
func (c *Containerd) Args(args ...string) []string {
	return append([]string{"--address", c.Socket, "--namespace", "crust-e2e"}, args...)
}

// OK runs ctr with args and answers its stdout; a failure fails the test.
func (c *Containerd) OK(t testing.TB, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(Ctr(), c.Args(args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// LogTail is the last 16 KiB of containerd's log (the shims' included).
func (c *Containerd) LogTail() string {
	b, _ := os.ReadFile(c.Log)
	if len(b) > 16<<10 {
		b = b[len(b)-16<<10:]
	}
	return string(b)
}

// Processes lists the live processes (QEMU, virtiofsd) whose command line names the shim's state
// directory, as harness.ProcessesNaming does.
func (c *Containerd) Processes() []string { return harness.ProcessesNaming(c.StateDir + "/") }

// MountsAt counts the mounts at or below dir.
func MountsAt(t testing.TB, dir string) int {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}

// busyboxApplets are the links the busybox image has in /bin.
var busyboxApplets = []string{"sh", "uname", "cat", "echo", "sync", "sleep", "touch", "grep", "ls"}

// ImportImage builds a one-layer image of the host's static busybox (Debian's busybox-static, or
// busybox) and imports it into containerd as ref; the test is skipped without a static busybox.
func (c *Containerd) ImportImage(t testing.TB, ref string) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox on the host (Debian package busybox-static)")
	}
	if out, _ := exec.Command("file", "-L", bb).Output(); !bytes.Contains(out, []byte("statically linked")) {
		t.Skipf("%s is not statically linked (Debian package busybox-static)", bb)
	}
	bin, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, d := range []string{"bin/", "data/", "dev/", "proc/", "sys/", "tmp/", "etc/"} {
		_ = tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	_ = tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))})
	_, _ = tw.Write(bin)
	for _, applet := range busyboxApplets {
		_ = tw.WriteHeader(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777})
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	c.importLayer(t, ref, layer.Bytes(), []string{"PATH=/bin"})
}

// ImportDir builds a one-layer image of the tree under root (regular files, directories and symbolic
// links, as they are) plus the directories a container needs (data, dev, proc, sys, tmp), with PATH
// and more env set, and imports it into containerd as ref.
func (c *Containerd) ImportDir(t testing.TB, ref, root string, env ...string) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = rel, 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err == nil {
			_, err = tw.Write(b)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"data", "dev", "proc", "sys", "tmp"} {
		if _, err := os.Lstat(filepath.Join(root, d)); err != nil {
			_ = tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	c.importLayer(t, ref, layer.Bytes(), append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...))
}

// importLayer makes an amd64 image of one layer with env and imports it as ref.
func (c *Containerd) importLayer(t testing.TB, ref string, layer []byte, env []string) {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf.Architecture, cf.OS, cf.Config.Env = "amd64", "linux", env
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	c.OK(t, "images", "import", file)
}
