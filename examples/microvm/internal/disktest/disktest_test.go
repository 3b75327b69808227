package disktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestImage: the file has the size asked, and mkfs gets it as its last argument (an ext4 made with -d
// holds the seed).
func TestImage(t *testing.T) {
	blank := Image(t, 4<<20)
	if fi, err := os.Stat(blank); err != nil || fi.Size() != 4<<20 {
		t.Fatalf("blank image: %v, %v; want 4 MiB", fi, err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skipf("mkfs.ext4: %v", err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "seed"), []byte("seed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := Image(t, 16<<20, "mkfs.ext4", "-q", "-b", "4096", "-d", src)
	out, err := exec.Command("debugfs", "-R", "cat /seed", img).Output()
	if err != nil {
		t.Skipf("debugfs: %v", err)
	}
	if string(out) != "seed\n" {
		t.Fatalf("/seed in the image holds %q", out)
	}
}
