package initramfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/cavaliergopher/cpio"

	"crust.dev/crust/examples/microvm/agentproto"
)

type entry struct {
	mode cpio.FileMode
	data string // contents, or link target
	pos  int
}

// readBack unpacks an archive with the same cpio library and returns its
// entries by name.
func readBack(t *testing.T, archive []byte) map[string]entry {
	t.Helper()
	// The kernel takes an uncompressed archive by its first bytes: newc's magic.
	if !bytes.HasPrefix(archive, []byte("070701")) {
		t.Fatalf("archive starts %q, not newc's magic", archive[:min(len(archive), 6)])
	}
	r := cpio.NewReader(bytes.NewReader(archive))
	out := map[string]entry{}
	for i := 0; ; i++ {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := out[h.Name]; dup {
			t.Fatalf("entry %s twice", h.Name)
		}
		if dir := path.Dir(h.Name); dir != "." {
			if p, ok := out[dir]; !ok || !p.mode.IsDir() {
				t.Fatalf("entry %s comes before its directory %s", h.Name, dir)
			}
		}
		e := entry{mode: h.Mode, pos: i, data: h.Linkname}
		if h.Mode.IsRegular() {
			b, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			e.data = string(b)
		}
		out[h.Name] = e
	}
	return out
}

func write(t *testing.T, p, data string, mode os.FileMode) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.WriteFile("/a/b/c.txt", 0o640, []byte("hello")))
	must(w.Mkdir("a", 0o700)) // already added as a parent: no second entry
	must(w.Symlink("bin/sh", "/bin/busybox"))
	must(w.Mkdir("/tmp", fs.ModeSticky|0o777))
	must(w.WriteFile("empty", 0o600, nil))
	must(w.Close())

	got := readBack(t, buf.Bytes())
	want := map[string]entry{
		"a":         {mode: cpio.TypeDir | 0o755},
		"a/b":       {mode: cpio.TypeDir | 0o755},
		"a/b/c.txt": {mode: cpio.TypeReg | 0o640, data: "hello"},
		"bin":       {mode: cpio.TypeDir | 0o755},
		"bin/sh":    {mode: cpio.TypeSymlink | 0o777, data: "/bin/busybox"},
		"tmp":       {mode: cpio.TypeDir | cpio.ModeSticky | 0o777},
		"empty":     {mode: cpio.TypeReg | 0o600},
	}
	if len(got) != len(want) {
		t.Fatalf("entries = %v, want %v", got, want)
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || g.mode != w.mode || g.data != w.data {
			t.Errorf("%s = %+v (ok %v), want mode %v data %q", name, g, ok, w.mode, w.data)
		}
	}

	// The same inputs give the same bytes.
	var again bytes.Buffer
	w2 := NewWriter(&again)
	must(w2.WriteFile("/a/b/c.txt", 0o640, []byte("hello")))
	must(w2.Mkdir("a", 0o700))
	must(w2.Symlink("bin/sh", "/bin/busybox"))
	must(w2.Mkdir("/tmp", fs.ModeSticky|0o777))
	must(w2.WriteFile("empty", 0o600, nil))
	must(w2.Close())
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("archive is not reproducible")
	}
}

// A fetch-kernel.sh layout, loaded and written as a guest, gives /init, the
// modules in order with their list, and the tools tree.
func TestGuestFromAssets(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "cloud", "vmlinux"), "kernel", 0o644)
	write(t, filepath.Join(dir, "cloud", "modules", "virtio.ko"), "m1", 0o644)
	write(t, filepath.Join(dir, "cloud", "modules", "virtio_blk.ko"), "m2", 0o644)
	write(t, filepath.Join(dir, "cloud", "modules.load"), "virtio.ko\n\nvirtio_blk.ko\n", 0o644)
	tools := filepath.Join(dir, "tools")
	write(t, filepath.Join(tools, "bin", "busybox"), "bb", 0o755)
	write(t, filepath.Join(tools, "lib64", "ld-linux-x86-64.so.2"), "ld", 0o755)
	write(t, filepath.Join(tools, ".stamp"), "skip me", 0o644)
	if err := os.Symlink("/bin/busybox", filepath.Join(tools, "bin", "sh")); err != nil {
		t.Fatal(err)
	}
	agent := write(t, filepath.Join(dir, "crust-guest"), "agent", 0o700)

	a, err := LoadAssets(dir, "cloud")
	if err != nil {
		t.Fatal(err)
	}
	if a.Kernel != filepath.Join(dir, "cloud", "vmlinux") || len(a.Modules) != 2 || filepath.Base(a.Modules[1]) != "virtio_blk.ko" {
		t.Fatalf("assets = %+v", a)
	}
	out := filepath.Join(dir, "initramfs.cpio")
	extra := write(t, filepath.Join(dir, "fio"), "fio", 0o700)
	files := []File{{Name: "/usr/bin/fio", Source: extra, Mode: 0o755}, {Name: "/bin/busybox", Source: extra, Mode: 0o755}}
	if err := (Guest{Agent: agent, Modules: a.Modules, Tools: a.Tools, Files: files}).WriteFile(out); err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := readBack(t, archive)
	mods := agentproto.ModulesDir[1:]
	checks := map[string]entry{
		"init":                       {mode: cpio.TypeReg | 0o755, data: "agent"},
		mods + "/virtio.ko":          {mode: cpio.TypeReg | 0o644, data: "m1"},
		mods + "/virtio_blk.ko":      {mode: cpio.TypeReg | 0o644, data: "m2"},
		agentproto.ModuleList[1:]:    {mode: cpio.TypeReg | 0o644, data: "virtio.ko\nvirtio_blk.ko\n"},
		"bin/busybox":                {mode: cpio.TypeReg | 0o755, data: "bb"}, // a File does not replace a tool
		"usr/bin/fio":                {mode: cpio.TypeReg | 0o755, data: "fio"},
		"bin/sh":                     {mode: cpio.TypeSymlink | 0o777, data: "/bin/busybox"},
		"lib64/ld-linux-x86-64.so.2": {mode: cpio.TypeReg | 0o755, data: "ld"},
		"dev":                        {mode: cpio.TypeDir | 0o755},
		"proc":                       {mode: cpio.TypeDir | 0o755},
		"sys":                        {mode: cpio.TypeDir | 0o755},
		"tmp":                        {mode: cpio.TypeDir | cpio.ModeSticky | 0o777},
		"etc/mtab":                   {mode: cpio.TypeSymlink | 0o777, data: "/proc/self/mounts"},
	}
	for name, w := range checks {
		g, ok := got[name]
		if !ok || g.mode != w.mode || g.data != w.data {
			t.Errorf("%s = %+v (present %v), want mode %v data %q", name, g, ok, w.mode, w.data)
		}
	}
	if _, ok := got[".stamp"]; ok {
		t.Error(".stamp was copied")
	}
	if got[mods+"/virtio.ko"].pos > got[mods+"/virtio_blk.ko"].pos {
		t.Error("modules out of load order")
	}

	// A missing module is caught when loading, not at boot.
	if err := os.Remove(filepath.Join(dir, "cloud", "modules", "virtio.ko")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAssets(dir, "cloud"); err == nil {
		t.Fatal("LoadAssets accepted a missing module")
	}
}
