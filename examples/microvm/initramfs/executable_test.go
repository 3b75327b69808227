package initramfs

import (
	"os/exec"
	"slices"
	"testing"
)

func TestParseLDD(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibaio.so.1 => /lib/x86_64-linux-gnu/libaio.so.1 (0x00007f1)\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n"
	got, err := parseLDD(out)
	want := []string{"/lib/x86_64-linux-gnu/libaio.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("parseLDD = %q, %v; want %q", got, err, want)
	}
	if _, err := parseLDD("\tlibgone.so.1 => not found\n"); err == nil {
		t.Fatal("parseLDD accepted a library ldd did not find")
	}
}

// TestExecutable gathers a dynamically linked program of the host: the program, libc and the loader.
func TestExecutable(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on this host")
	}
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("no ldd on this host")
	}
	files, err := Executable(sh)
	if err != nil {
		t.Fatal(err)
	}
	libc, loader := false, false
	for _, f := range files {
		switch {
		case slices.Contains([]string{"libc.so.6"}, baseName(f.Name)):
			libc = true
		case baseName(f.Name) == "ld-linux-x86-64.so.2" || baseName(f.Name) == "ld-linux-aarch64.so.1":
			loader = true
		}
	}
	if len(files) < 2 || !libc || !loader {
		t.Fatalf("Executable(%s) = %+v: want the program, libc and the loader", sh, files)
	}
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}
