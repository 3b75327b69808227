package safedir_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"

	"crust.dev/crust/api/safedir"
	"crust.dev/crust/api/safedir/safedirtest"
)

// planted makes a directory holding a link to a directory outside, a link to a file outside, a regular
// file, a directory and a FIFO; it returns the open directory and the outside directory.
func planted(t *testing.T) (*safedir.Dir, string) {
	t.Helper()
	root, outside := t.TempDir(), t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600))
	must(t, os.Symlink(outside, filepath.Join(root, "link-dir")))
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "link-file")))
	must(t, os.WriteFile(filepath.Join(root, "file"), []byte("file"), 0o600))
	must(t, os.Mkdir(filepath.Join(root, "dir"), 0o700))
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600))
	must(t, syscall.Mknod(filepath.Join(root, "socket"), syscall.S_IFSOCK|0o600, 0)) // a socket's inode, as bind makes
	d, err := safedir.Open(root)
	must(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestNeverThroughALink: every operation on a link, or on an entry of the wrong kind, is refused with
// ErrWrongType (or, for a name of more than one element, fs.ErrInvalid), and nothing outside changes.
func TestNeverThroughALink(t *testing.T) {
	tmpOf := func(d *safedir.Dir) *safedir.Dir {
		tmp, err := d.EnsureDir("tmp", 0o700)
		must(t, err)
		t.Cleanup(func() { _ = tmp.Close() })
		return tmp
	}
	cases := []struct {
		name string
		op   func(d *safedir.Dir) error
		want error
	}{
		{"OpenDir of a link to a directory", func(d *safedir.Dir) error { _, err := d.OpenDir("link-dir"); return err }, safedir.ErrWrongType},
		{"OpenDir of a file", func(d *safedir.Dir) error { _, err := d.OpenDir("file"); return err }, safedir.ErrWrongType},
		{"OpenDir through a link in the middle", func(d *safedir.Dir) error { _, err := d.OpenDir("link-dir/sub"); return err }, fs.ErrInvalid},
		{"OpenDir of ..", func(d *safedir.Dir) error { _, err := d.OpenDir(".."); return err }, fs.ErrInvalid},
		{"EnsureDir of a link", func(d *safedir.Dir) error { _, err := d.EnsureDir("link-dir", 0o700); return err }, safedir.ErrWrongType},
		{"read a link to a file", func(d *safedir.Dir) error { _, err := d.ReadFile("link-file", 100); return err }, safedir.ErrWrongType},
		{"read a directory", func(d *safedir.Dir) error { _, err := d.ReadFile("dir", 100); return err }, safedir.ErrWrongType},
		{"read a FIFO (without blocking)", func(d *safedir.Dir) error { _, err := d.ReadFile("fifo", 100); return err }, safedir.ErrWrongType},
		{"read a socket", func(d *safedir.Dir) error { _, err := d.ReadFile("socket", 100); return err }, safedir.ErrWrongType},
		{"read beneath through a link in the middle", func(d *safedir.Dir) error {
			_, _, err := d.ReadFileBeneath("link-dir/secret", 100)
			return err
		}, safedir.ErrWrongType},
		{"read beneath a link at the end", func(d *safedir.Dir) error { _, _, err := d.ReadFileBeneath("link-file", 100); return err }, safedir.ErrWrongType},
		{"read beneath, climbing out", func(d *safedir.Dir) error { _, _, err := d.ReadFileBeneath("dir/../../x", 100); return err }, fs.ErrInvalid},
		{"read beneath, an absolute path", func(d *safedir.Dir) error { _, _, err := d.ReadFileBeneath("/etc/passwd", 100); return err }, fs.ErrInvalid},
		{"read a file through a link in the middle", func(d *safedir.Dir) error { _, err := d.ReadFile("link-dir/secret", 100); return err }, fs.ErrInvalid},
		{"create through a link", func(d *safedir.Dir) error {
			_, err := d.OpenFile("link-file", os.O_WRONLY|os.O_CREATE, 0o600)
			return err
		}, safedir.ErrWrongType},
		{"write a file over a directory", func(d *safedir.Dir) error { return d.WriteFile("dir", []byte("x"), 0o600, tmpOf(d)) }, safedir.ErrWrongType},
		{"write a file with a link as the temporary directory", func(d *safedir.Dir) error {
			tmp, err := d.OpenDir("link-dir")
			if err != nil {
				return err
			}
			return d.WriteFile("new", []byte("x"), 0o600, tmp)
		}, safedir.ErrWrongType},
		{"Remove of a directory", func(d *safedir.Dir) error { return d.Remove("dir") }, safedir.ErrWrongType},
		{"open the directory itself through a link", func(d *safedir.Dir) error {
			_, err := safedir.Open(d.Join("link-dir"))
			return err
		}, safedir.ErrWrongType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, outside := planted(t)
			before := safedirtest.Snapshot(t, outside)
			err := tc.op(d)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			safedirtest.Unchanged(t, before, outside)
		})
	}
}

// TestLinksAreActedOnNotFollowed: the operations that may take a link act on the link itself.
func TestLinksAreActedOnNotFollowed(t *testing.T) {
	cases := []struct {
		name  string
		entry string
		op    func(d *safedir.Dir) error
		after fs.FileMode // of the entry afterwards; 0 for gone
	}{
		{"WriteFile replaces a link to a file", "link-file", func(d *safedir.Dir) error {
			tmp, err := d.EnsureDir("tmp", 0o700)
			if err != nil {
				return err
			}
			defer func() { _ = tmp.Close() }()
			return d.WriteFile("link-file", []byte("new"), 0o600, tmp)
		}, 0o600},
		{"Remove removes the link", "link-file", func(d *safedir.Dir) error { return d.Remove("link-file") }, 0},
		{"RemoveAll removes a link to a directory, not the directory's content", "link-dir", func(d *safedir.Dir) error { return d.RemoveAll("link-dir") }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, outside := planted(t)
			before := safedirtest.Snapshot(t, outside)
			must(t, tc.op(d))
			safedirtest.Unchanged(t, before, outside)
			var mode fs.FileMode
			fi, err := d.Lstat(tc.entry)
			if err == nil {
				mode = fi.Mode()
			} else if !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			if mode != tc.after {
				t.Errorf("%s: mode %v, want %v", tc.entry, mode, tc.after)
			}
		})
	}
}

// TestRemoveAll deletes a tree without following the links in it.
func TestRemoveAll(t *testing.T) {
	d, outside := planted(t)
	before := safedirtest.Snapshot(t, outside)
	must(t, os.MkdirAll(d.Join("dir/a/b"), 0o700))
	must(t, os.Symlink(outside, d.Join("dir/a/link")))
	must(t, os.WriteFile(d.Join("dir/a/b/f"), nil, 0o600))
	must(t, d.RemoveAll("dir"))
	must(t, d.RemoveAll("dir")) // gone: not an error
	if _, err := d.Lstat("dir"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dir still there: %v", err)
	}
	safedirtest.Unchanged(t, before, outside)
}

// TestCheckOwned refuses a directory another user owns or may write in.
func TestCheckOwned(t *testing.T) {
	type ownedCase struct {
		safedirtest.Dir
		want error
	}
	safedirtest.EachDir(t, []ownedCase{
		{safedirtest.Dir{Name: "ours, 0700", Mode: 0o700}, nil},
		{safedirtest.Dir{Name: "ours, 0755", Mode: 0o755}, nil},
		{safedirtest.Dir{Name: "ours, 0777", Mode: 0o777}, safedir.ErrInsecure},
		{safedirtest.Dir{Name: "ours, group-writable", Mode: 0o770}, safedir.ErrInsecure},
		{safedirtest.Dir{Name: "ours, sticky and world-writable", Mode: 0o777 | fs.ModeSticky}, safedir.ErrInsecure},
		{safedirtest.Dir{Name: "another user's, 0700", Mode: 0o700, UID: 1000}, safedir.ErrInsecure},
	}, func(t *testing.T, tc ownedCase, dir, _ string) {
		d, err := safedir.Open(dir)
		must(t, err)
		defer func() { _ = d.Close() }()
		if err := d.CheckOwned(); !errors.Is(err, tc.want) {
			t.Fatalf("CheckOwned = %v, want %v", err, tc.want)
		}
		_, err = safedir.OpenOwned(dir)
		if !errors.Is(err, tc.want) {
			t.Fatalf("OpenOwned = %v, want %v", err, tc.want)
		}
		fi, err := os.Stat(dir)
		must(t, err)
		if fi.Mode()&(fs.ModePerm|fs.ModeSticky) != tc.Mode {
			t.Fatalf("mode %v afterwards, want %v unchanged", fi.Mode(), tc.Mode)
		}
	})
}

// TestWriteFile is atomic: the file has the new content and mode, and the temporary directory is empty.
func TestWriteFile(t *testing.T) {
	d, err := safedir.OpenOwned(filepath.Join(t.TempDir(), "state"))
	must(t, err)
	tmp, err := d.EnsureDir("tmp", 0o700)
	must(t, err)
	for _, content := range []string{"one", "two"} {
		must(t, d.WriteFile("f", []byte(content), 0o600, tmp))
		b, err := d.ReadFile("f", 10)
		must(t, err)
		if string(b) != content {
			t.Fatalf("read %q, want %q", b, content)
		}
	}
	if _, err := d.ReadFile("f", 2); !errors.Is(err, safedir.ErrTooLarge) {
		t.Fatalf("ReadFile past its limit: err = %v, want ErrTooLarge", err)
	}
	if b, fi, err := d.ReadFileInfo("f", 3); err != nil || string(b) != "two" || fi.Mode() != 0o600 || fi.Size() != 3 {
		t.Fatalf("ReadFileInfo = %q, %v, %v; want \"two\", mode 0600, size 3", b, fi, err)
	}
	sub, err := d.EnsureDir("sub", 0o700)
	must(t, err)
	must(t, sub.WriteFile("g", []byte("below"), 0o640, tmp))
	if b, fi, err := d.ReadFileBeneath("sub/g", 10); err != nil || string(b) != "below" || fi.Mode() != 0o640 || fi.Name() != "g" {
		t.Fatalf("ReadFileBeneath = %q, %v, %v; want \"below\", mode 0640, name g", b, fi, err)
	}
	fi, err := d.Lstat("f")
	must(t, err)
	if fi.Mode() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if names, _ := tmp.Names(); len(names) != 0 {
		t.Fatalf("tmp holds %v", names)
	}
	name, sub, err := tmp.MkdirTemp("x-")
	must(t, err)
	must(t, sub.WriteFileAtomic("in", []byte("in"), 0o600, tmp)) // MkdirTemp's directory is open
	must(t, sub.Close())
	must(t, tmp.RenameNoReplace(name, d, "tmp2"))
	if data, err := os.ReadFile(d.Join("tmp2/in")); err != nil || string(data) != "in" {
		t.Fatalf("the file written in MkdirTemp's directory: %q, %v", data, err)
	}
	name, sub, err = tmp.MkdirTemp("x-")
	must(t, err)
	must(t, sub.Close())
	if err := tmp.RenameNoReplace(name, d, "tmp2"); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("RenameNoReplace onto an existing name: %v", err)
	}

	// WriteNew creates, with its mode whatever the umask, and never replaces or writes through.
	old := syscall.Umask(0o077)
	err = d.WriteNew("new", []byte("new"), 0o644, true)
	syscall.Umask(old)
	must(t, err)
	if fi, err := d.Lstat("new"); err != nil || fi.Mode() != 0o644 {
		t.Fatalf("WriteNew's file: %v, %v", fi, err)
	}
	if err := d.WriteNew("new", []byte("again"), 0o644, false); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("WriteNew over a file: %v", err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	must(t, os.Symlink(outside, d.Join("link")))
	if err := d.WriteNew("link", []byte("x"), 0o644, false); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("WriteNew over a link: %v", err)
	}
	if _, err := os.Lstat(outside); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("WriteNew wrote through a link: %v", err)
	}
	if data, err := os.ReadFile(d.Join("new")); err != nil || string(data) != "new" {
		t.Fatalf("the file WriteNew refused to replace: %q, %v", data, err)
	}
}

// TestNamesAndClose: Names lists every entry, sorted, however many reads of the directory that takes; a
// second Close of a Dir is fs.ErrClosed and closes nothing else.
func TestNamesAndClose(t *testing.T) {
	root := t.TempDir()
	var want []string
	for i := range 600 { // more than one 8 KiB read of directory entries
		name := fmt.Sprintf("entry-with-a-longish-name-%04d", i)
		want = append(want, name)
		must(t, os.WriteFile(filepath.Join(root, name), nil, 0o600))
	}
	d, err := safedir.Open(root)
	must(t, err)
	got, err := d.Names()
	must(t, err)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Names: %d names, want %d sorted", len(got), len(want))
	}
	must(t, d.Close())
	other, err := safedir.Open(root) // may reuse the descriptor number d had
	must(t, err)
	if err := d.Close(); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := other.Names(); err != nil {
		t.Fatalf("a second Close of another Dir closed this one: %v", err)
	}
	must(t, other.Close())
}

// TestUnclosedDirIsClosedWhenCollected: the descriptor of a Dir dropped without Close is closed once the
// Dir is collected, as an os.File's is, so a leak on an error path does not keep descriptors forever.
func TestUnclosedDirIsClosedWhenCollected(t *testing.T) {
	root := t.TempDir()
	open := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		must(t, err)
		return len(es)
	}
	before := open()
	for range 64 {
		d, err := safedir.Open(root)
		must(t, err)
		_ = d
	}
	if open() < before+64 {
		t.Fatalf("64 Dirs opened but %d descriptors more", open()-before)
	}
	// Cleanups run after a collection, on a goroutine of their own: collect until they have run.
	for i := 0; open() > before; i++ {
		if i == 1000 {
			t.Fatalf("after 1000 collections %d of the 64 descriptors are still open", open()-before)
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// Overlapping Syncs of one directory share fsyncs, and every one of them returns only after an fsync that
// began after it was called: each writer's rename is durable when its Sync returns nil. An fsync that
// fails fails every call waiting on it.
func TestSyncConcurrent(t *testing.T) {
	d, err := safedir.Open(t.TempDir())
	must(t, err)
	tmp, err := d.EnsureDir("tmp", 0o700)
	must(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			errs <- d.WriteFile(fmt.Sprintf("f%d", i), []byte("x"), 0o600, tmp) // renames, then Syncs d
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	names, err := d.Names()
	must(t, err)
	if len(names) != 65 { // 64 files and tmp
		t.Fatalf("%d entries, want 65", len(names))
	}
	must(t, tmp.Close())
	must(t, d.Close())
	for range 2 {
		if err := d.Sync(); err == nil {
			t.Fatal("Sync of a closed directory succeeded")
		}
	}
}
