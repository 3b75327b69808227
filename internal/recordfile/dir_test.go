package recordfile

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"crust.dev/crust/api/errdefs"
)

// testOptions are the options of a record directory the tests open, with an extra subdirectory.
var testOptions = Options{Version: 1, Field: "p", BootID: "b1", Records: "recs", Extra: []string{"more"}, Holder: "test"}

// keepAll is a Check that keeps every record.
func keepAll(Loaded) (bool, error) { return false, nil }

// Open hands every valid record to the check and acts on its verdicts: kept, dropped (deleted) or moved
// aside; a damaged envelope is moved aside without reaching the check; tmp/ is emptied; the lock is held
// until Close; a newer record stops Open with nothing moved; records of the older versions read are
// handed to the check with their version.
func TestOpenClassifies(t *testing.T) {
	dir := t.TempDir()
	opt := testOptions
	d, _, err := Open(dir, opt, keepAll)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"keep", "drop", "refuse"} {
		if err := d.Put(name, []byte(`"`+name+`"`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Put("gone", []byte(`1`)); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(d.Delete("gone"), d.Delete("gone")); err != nil {
		t.Fatalf("Delete, twice: %v", err)
	}
	if d.Extra("more") == nil {
		t.Fatal("the extra subdirectory is not open")
	}
	if _, _, err := Open(dir, opt, keepAll); !errors.Is(err, ErrHeld) {
		t.Fatalf("second Open while locked: %v", err)
	}
	d.Close()
	recs := filepath.Join(dir, "recs")
	if err := os.WriteFile(filepath.Join(recs, "torn"), []byte(`{"version":1,"bootId":"b1","sha`), 0o600); err != nil {
		t.Fatal(err)
	}
	// a socket's inode (as bind makes), which cannot be opened: damage like a link, not an I/O error
	if err := syscall.Mknod(filepath.Join(recs, "sock"), syscall.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp", "leftover"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	var mu sync.Mutex // Open checks records on several goroutines
	d, report, err := Open(dir, opt, func(l Loaded) (bool, error) {
		mu.Lock()
		seen[l.Name] = string(l.Payload)
		mu.Unlock()
		switch l.Name {
		case "drop":
			return true, nil
		case "refuse":
			return false, errors.New("not mine")
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if len(seen) != 3 || seen["keep"] != `"keep"` {
		t.Errorf("the check saw %v; want keep, drop and refuse", seen)
	}
	if len(report.Dropped) != 1 || report.Dropped[0] != "drop" || len(report.Corrupt) != 3 {
		t.Errorf("report %+v; want drop dropped, refuse, sock and torn moved aside", report)
	}
	if names, _ := os.ReadDir(recs); len(names) != 1 || names[0].Name() != "keep" {
		t.Errorf("records left: %v; want keep", names)
	}
	if names, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(names) != 0 {
		t.Errorf("tmp/ not emptied: %v", names)
	}

	newer, err := Encode(2, "b1", "p", []byte(`1`))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(recs, "newer"), newer, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(dir, opt, keepAll); !errors.Is(err, ErrNewerVersion) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Open over a newer record: %v", err)
	}
	if names, _ := os.ReadDir(recs); len(names) != 2 {
		t.Errorf("Open over a newer record changed the records: %v", names)
	}

	// The code of version 2 that still reads 1 loads both, each with its version.
	opt.Version, opt.OldestVersion = 2, 1
	versions := map[string]int{}
	d, _, err = Open(dir, opt, func(l Loaded) (bool, error) {
		mu.Lock()
		versions[l.Name] = l.Version
		mu.Unlock()
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if len(versions) != 2 || versions["keep"] != 1 || versions["newer"] != 2 {
		t.Errorf("versions handed to the check: %v; want keep 1, newer 2", versions)
	}
}

// WriteExtra writes a file into an extra subdirectory as Put writes a record (Read reads it back), Open
// leaves it alone, and a subdirectory that is not one of Options.Extra, or a file past MaxSize, is
// InvalidArgument.
func TestWriteExtra(t *testing.T) {
	dir := t.TempDir()
	d, _, err := Open(dir, testOptions, keepAll)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := Encode(1, "b1", "x", []byte(`42`))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WriteExtra("more", "r.json", rec); err != nil {
		t.Fatal(err)
	}
	for sub, data := range map[string][]byte{"recs": rec, "none": rec, "more": make([]byte, MaxSize+1)} {
		if err := d.WriteExtra(sub, "r.json", data); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("WriteExtra into %s of %d bytes: %v, want InvalidArgument", sub, len(data), err)
		}
	}
	d.Close()
	if d, _, err = Open(dir, testOptions, keepAll); err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := Read(d.Extra("more"), "r.json")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := Decode(got, 1, 1, "x"); err != nil || string(r.Payload) != "42" {
		t.Errorf("read back %q: %+v, %v", got, r, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "more", "r.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the file: %v, %v; want mode 0600", fi, err)
	}
}
