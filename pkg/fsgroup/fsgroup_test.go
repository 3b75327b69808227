//go:build linux

package fsgroup

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"crust.dev/crust/internal/testutil"
)

func TestApply(t *testing.T) {
	testutil.RequireRoot(t, "to change groups (fsGroup)")
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(root, "sub")
	file := filepath.Join(sub, "f")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o604); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(sub, "link")); err != nil {
		t.Fatal(err)
	}
	const gid = 4321
	check := func(p string, wantMode uint32) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Gid != gid || st.Mode&^unix.S_IFMT != wantMode {
			t.Errorf("%s: gid %d mode %o, want gid %d mode %o", p, st.Gid, st.Mode&^unix.S_IFMT, gid, wantMode)
		}
	}

	// OnRootMismatch on a root that does not match walks everything.
	if err := Apply(root, gid, OnRootMismatch); err != nil {
		t.Fatal(err)
	}
	check(root, 0o2775)
	check(sub, 0o2770)
	check(file, 0o664)
	check(filepath.Join(sub, "link"), 0o777)

	// Now the root matches: OnRootMismatch leaves a changed file alone,
	// Always fixes it.
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Apply(root, gid, OnRootMismatch); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	_ = unix.Stat(file, &st)
	if st.Mode&0o777 != 0o600 {
		t.Fatalf("OnRootMismatch walked a matching root (file mode %o)", st.Mode&0o777)
	}
	if err := Apply(root, gid, Always); err != nil {
		t.Fatal(err)
	}
	check(file, 0o660)
}
