package dataload

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWorkloads runs every workload through Main on a temporary directory and checks what each did and
// printed.
func TestWorkloads(t *testing.T) {
	dir := t.TempDir()
	tree, file := filepath.Join(dir, "tree"), filepath.Join(dir, "seq")
	for _, c := range []struct {
		args []string
		ops  int64
		unit string
	}{
		{[]string{"create", "-dir", tree, "-n", "150"}, 150, "files"},
		{[]string{"stat", "-dir", tree}, 1 + 2 + 150, "entries"}, // the root, two directories, the files
		{[]string{"read", "-dir", tree}, 150, "files"},
		{[]string{"write", "-file", file, "-mib", "2"}, 2 << 20, "bytes"},
		{[]string{"seqread", "-file", file}, 2 << 20, "bytes"},
		{[]string{"sqlite", "-db", filepath.Join(dir, "wal.db"), "-journal", "wal", "-tx", "5"}, 5, "transactions"},
		{[]string{"sqlite", "-db", filepath.Join(dir, "del.db"), "-journal", "delete", "-tx", "5"}, 5, "transactions"},
	} {
		var out, errOut bytes.Buffer
		if code := Main(c.args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, errOut.String())
		}
		var r Result
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("%v: %q: %v", c.args, out.String(), err)
		}
		if r.Workload != c.args[0] || r.Ops != c.ops || r.Unit != c.unit || r.Seconds <= 0 || r.Rate() <= 0 {
			t.Errorf("%v: result %+v, want %d %s", c.args, r, c.ops, c.unit)
		}
	}
	if fi, err := os.Stat(filepath.Join(tree, "d001", "f00149")); err != nil || fi.Size() != FileSize {
		t.Errorf("the last file created: %v, %v", fi, err)
	}

	var out, errOut bytes.Buffer
	if code := Main([]string{"sqlite", "-db", filepath.Join(dir, "x.db"), "-journal", "memory"}, &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "journal mode") {
		t.Errorf("an unknown journal mode: exit %d, %q", code, errOut.String())
	}
}
