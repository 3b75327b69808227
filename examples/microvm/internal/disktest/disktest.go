// Package disktest makes disk images for the example's tests.
package disktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Image makes a sparse file of size bytes in a new temporary directory of the test and, when mkfs is
// given, runs it with the file as its last argument (mkfs[0] is the command), failing the test when that
// fails. It returns the file's path.
func Image(t testing.TB, size int64, mkfs ...string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	if len(mkfs) > 0 {
		if out, err := exec.Command(mkfs[0], append(mkfs[1:], file)...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v\n%s", mkfs, err, out)
		}
	}
	return file
}
