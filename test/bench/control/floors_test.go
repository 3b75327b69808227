package control

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
)

// kataLib does, in process, what Kata's direct-volume library (the Go package a driver links, as Azure's
// does, or `kata-runtime direct-volume add|remove` runs) does with a volume: Add makes the volume's
// directory (base64url of the volume path) under the root, checks that the mount info decodes, and writes
// mountInfo.json in place, without fsync; Remove removes the volume's directory with everything in it.
// That is the cost a driver pays without crust: no daemon, no durability, no checks of the device.
type kataLib struct{ root string }

func (k kataLib) volumeDir(volumePath string) string {
	return filepath.Join(k.root, base64.URLEncoding.EncodeToString([]byte(volumePath)))
}

// pair adds and removes the volume of spec, as a driver would at publish and unpublish.
func (k kataLib) pair(b *testing.B, spec *crustv1.VolumeSpec) {
	mi, err := json.Marshal(kata.MountInfo{VolumeType: kata.VolumeTypeDirect, Device: spec.GetVolumeBackingPath(), FsType: spec.GetFsType()})
	if err != nil {
		b.Fatal(err)
	}
	if err := k.add(spec.GetVolumeTargetPath(), string(mi)); err != nil {
		b.Fatal(err)
	}
	if err := os.RemoveAll(k.volumeDir(spec.GetVolumeTargetPath())); err != nil {
		b.Fatal(err)
	}
}

func (k kataLib) add(volumePath, mountInfo string) error {
	dir := k.volumeDir(volumePath)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	case err != nil:
		return err
	case !st.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	}
	var check kata.MountInfo
	if err := json.Unmarshal([]byte(mountInfo), &check); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "mountInfo.json"), []byte(mountInfo), 0o600)
}

// durableFloor is the least a store must do to make a record durable and then its removal, in one
// directory: write a temporary file, fsync it, rename it over the record, fsync the directory; unlink
// the record, fsync the directory.
type durableFloor struct {
	dir     string
	dirFile *os.File
	record  []byte
}

func newDurableFloor(b *testing.B, dir string, recordSize int) *durableFloor {
	b.Helper()
	f, err := os.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	rec := make([]byte, recordSize)
	for i := range rec {
		rec[i] = 'a' + byte(i%26)
	}
	return &durableFloor{dir: dir, dirFile: f, record: rec}
}

func (d *durableFloor) pair(b *testing.B, i int) {
	tmp, name := filepath.Join(d.dir, fmt.Sprintf(".tmp-%d", i)), filepath.Join(d.dir, fmt.Sprintf("r-%d", i))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.Write(d.record); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		b.Fatal(err)
	}
	if err := unix.Fsync(int(d.dirFile.Fd())); err != nil {
		b.Fatal(err)
	}
	if err := os.Remove(name); err != nil {
		b.Fatal(err)
	}
	if err := unix.Fsync(int(d.dirFile.Fd())); err != nil {
		b.Fatal(err)
	}
}
