package recordfile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/internal/recordfile/recordfiletest"
)

func keepAll(recordfile.Loaded) (bool, error) { return false, nil }

func options(holder string) recordfile.Options {
	return recordfile.Options{Version: 1, Field: "p", BootID: "b1", Records: "recs", Holder: holder}
}

// A second opener, whoever it is, is refused at once naming the directory and the holder, and changes
// nothing; Close gives the directory up for the next one.
func TestSecondOpenerRefused(t *testing.T) {
	dir := t.TempDir()
	first, _, err := recordfile.Open(dir, options("first"), keepAll)
	if err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(dir, "tmp", "leftover") // what the second Open would empty
	if err := os.WriteFile(leftover, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = recordfile.Open(dir, options("second"), keepAll)
	recordfiletest.WantHeld(t, err, dir, "first")
	if _, err := os.Stat(leftover); err != nil {
		t.Fatalf("the refused Open touched the directory: %v", err)
	}
	first.Close()
	first.Close()
	second, _, err := recordfile.Open(dir, options("second"), keepAll)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	second.Close()
	if b, _ := os.ReadFile(filepath.Join(dir, "lock")); string(b) != fmt.Sprintf("pid %d (second)\n", os.Getpid()) {
		t.Errorf("the lock file says %q", b)
	}
}

// Anything but a regular file at the lock's place (a link is never followed) is refused before anything
// is created.
func TestLockFileNotAFile(t *testing.T) {
	for name, plant := range map[string]func(string) error{
		"link":      func(p string) error { return os.Symlink(filepath.Join(filepath.Dir(p), "elsewhere"), p) },
		"directory": func(p string) error { return os.Mkdir(p, 0o700) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := plant(filepath.Join(dir, "lock")); err != nil {
				t.Fatal(err)
			}
			if _, _, err := recordfile.Open(dir, options("test"), keepAll); !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Fatalf("Open = %v; want FAILED_PRECONDITION", err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("a refused Open created %v", entries)
			}
		})
	}
}

// An empty holder is refused: every opener names itself for the next one's refusal.
func TestOpenRefusesEmptyHolder(t *testing.T) {
	if _, _, err := recordfile.Open(t.TempDir(), options(""), keepAll); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Open without a holder: %v, want ErrInvalidArgument", err)
	}
}
