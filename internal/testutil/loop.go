package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Loop attaches a new sparse file of size bytes to a free loop device, and detaches it when the test ends
// (reporting a failure to detach). It returns the device and the file. A test not run as root is skipped.
func Loop(t testing.TB, size int64) (dev, file string) {
	t.Helper()
	RequireRoot(t, "for a loop device")
	file = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	return LoopOver(t, file), file
}

// LoopOver attaches file, which may have loop devices attached already, to a free loop device, and
// detaches it when the test ends (reporting a failure to detach). It returns the device. A test not run
// as root is skipped.
func LoopOver(t testing.TB, file string) (dev string) {
	t.Helper()
	RequireRoot(t, "for a loop device")
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// PartitionedLoop attaches a new sparse file of size bytes (at least 2 MiB) to a free loop device with
// partition scanning on (losetup -P), gives it one partition from 1 MiB to the end, and detaches it, its
// partition with it, when the test ends. It returns the disk and the partition (such as /dev/loop3 and
// /dev/loop3p1). The partition is added with BLKPG (addpart) rather than read from a partition table, so
// it exists on kernels built without partition-table parsers too. A test not run as root is skipped.
func PartitionedLoop(t testing.TB, size int64) (disk, part string) {
	t.Helper()
	RequireRoot(t, "for a loop device")
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--partscan", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	disk = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", disk).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", disk, err, out)
		}
	})
	const sector, start = 512, 1 << 20
	if out, err := exec.Command("addpart", disk, "1", fmt.Sprint(start/sector), fmt.Sprint((size-start)/sector)).CombinedOutput(); err != nil {
		t.Fatalf("addpart %s: %v: %s", disk, err, out)
	}
	part = disk + "p1"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(part); err == nil {
			return disk, part
		} else if time.Now().After(deadline) {
			t.Fatalf("the partition %s did not appear: %v", part, err)
		}
	}
}
