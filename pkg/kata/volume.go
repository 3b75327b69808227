package kata

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/google/renameio/v2"
)

// TempDirName is the directory, inside the direct-volume directory, where this package prepares files and
// directories before renaming them into place. It starts with a dot, so it is never a volume directory.
const TempDirName = ".crust-tmp"

const (
	dirMode  = 0o700
	fileMode = 0o600
)

var (
	// ErrNotFound is returned for a volume that has no mountInfo.json (or, for SandboxIDs, no directory).
	ErrNotFound = errors.New("not found")
	// ErrInvalidSandboxID is returned by RecordSandbox for an id that cannot be a file name.
	ErrInvalidSandboxID = errors.New("invalid sandbox id")
)

// Volume is one direct-assigned volume as Kata sees it.
type Volume struct {
	// Path is the volume path (the path the volume is published to).
	Path string
	// MountInfo is the decoded mountInfo.json.
	MountInfo MountInfo
	// SandboxIDs are the sandboxes recorded as using the volume, in name order; Kata takes the first.
	SandboxIDs []string
}

// Add records mountInfo, a JSON MountInfo, for volumePath under dir, as `kata-runtime direct-volume add`
// does: the file holds mountInfo byte for byte, and sandbox-id files already in the volume directory stay.
// mountInfo must decode with ParseMountInfo; otherwise Add fails with ErrInvalidMountInfo and creates
// nothing. Add is atomic and durable: after a crash the volume has either its old mount info (or none) or
// the new one. Adding the same mount info again changes nothing.
func Add(dir, volumePath, mountInfo string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	if _, err := ParseMountInfo([]byte(mountInfo)); err != nil {
		return err
	}
	return writeMountInfo(dir, volumePath, []byte(mountInfo))
}

// AddMountInfo is Add with info encoded as Kata encodes it.
func AddMountInfo(dir, volumePath string, info *MountInfo) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	return Add(dir, volumePath, string(data))
}

// Remove deletes the volume directory of volumePath with everything in it, sandbox-id files included, as
// `kata-runtime direct-volume remove` does. A volume that is not there is not an error. The directory
// disappears at once: it is first renamed into the temporary directory, then deleted.
func Remove(dir, volumePath string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	volDir := filepath.Join(dir, VolumeDirName(volumePath))
	if _, err := os.Lstat(volDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	tmp, err := tempDir(dir)
	if err != nil {
		return err
	}
	trash, err := os.MkdirTemp(tmp, "remove-")
	if err != nil {
		return err
	}
	if err := os.Rename(volDir, filepath.Join(trash, "volume")); err != nil {
		_ = os.Remove(trash)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		return err
	}
	return errors.Join(syncDir(dir), os.RemoveAll(trash))
}

// Get returns the mount info of volumePath, decoded as Kata decodes it. It fails with ErrNotFound when
// the volume has no mountInfo.json, and with ErrInvalidMountInfo when the file does not decode.
func Get(dir, volumePath string) (*MountInfo, error) {
	if err := checkVolumePath(volumePath); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, VolumeDirName(volumePath), MountInfoFileName)
	data, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("direct volume %q: %w", volumePath, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	info, err := ParseMountInfo(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return info, nil
}

// SandboxIDs returns the name of every entry of the volume directory other than mountInfo.json, in name
// order, which is what Kata takes for sandbox ids (it uses the first). A volume with none returns an empty
// list; a volume directory that does not exist is ErrNotFound.
func SandboxIDs(dir, volumePath string) ([]string, error) {
	if err := checkVolumePath(volumePath); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(dir, VolumeDirName(volumePath)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("direct volume %q: %w", volumePath, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.Name() != MountInfoFileName {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// RecordSandbox records that sandboxID uses volumePath the way a Kata shim does, by creating an empty file
// named sandboxID (mode 0600) in the volume directory. It is for tests and stand-in shims. The volume must
// have a mountInfo.json (ErrNotFound otherwise) and sandboxID must be a plain file name other than
// mountInfo.json (ErrInvalidSandboxID otherwise). Recording the same id again is not an error.
func RecordSandbox(dir, volumePath, sandboxID string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	if err := checkSandboxID(sandboxID); err != nil {
		return err
	}
	volDir := filepath.Join(dir, VolumeDirName(volumePath))
	if _, err := os.Stat(filepath.Join(volDir, MountInfoFileName)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("direct volume %q: %w", volumePath, ErrNotFound)
	} else if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(volDir, sandboxID), nil, fileMode)
}

// ForgetSandbox removes the sandbox-id file sandboxID from the volume directory of volumePath, as Kata
// does when the sandbox goes away; it is how a claim recorded by a Kata shim is released by force. An
// id that is not there is not an error; an id that is not a plain file name is ErrInvalidSandboxID.
func ForgetSandbox(dir, volumePath, sandboxID string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	if err := checkSandboxID(sandboxID); err != nil {
		return err
	}
	volDir := filepath.Join(dir, VolumeDirName(volumePath))
	if err := os.Remove(filepath.Join(volDir, sandboxID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return syncDir(volDir)
}

// checkSandboxID is ErrInvalidSandboxID for an id that is not a plain file name of the volume directory
// other than mountInfo.json.
func checkSandboxID(id string) error {
	if id == "" || id == "." || id == ".." || id == MountInfoFileName || strings.ContainsAny(id, "/\x00") || len(id) > maxNameLen {
		return fmt.Errorf("%w: %q", ErrInvalidSandboxID, id)
	}
	return nil
}

// List returns every volume under dir, ordered by path. Entries that Kata would not take for a volume are
// skipped: anything that is not a directory, a name that ParseVolumeDirName refuses (such as
// TempDirName), and a directory without a mountInfo.json that decodes. A dir that does not exist holds no
// volumes.
func List(dir string) ([]Volume, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var vols []Volume
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		path, err := ParseVolumeDirName(e.Name())
		if err != nil {
			continue
		}
		info, err := Get(dir, path)
		if err != nil {
			continue
		}
		ids, err := SandboxIDs(dir, path)
		if err != nil {
			continue // removed meanwhile
		}
		vols = append(vols, Volume{Path: path, MountInfo: *info, SandboxIDs: ids})
	}
	slices.SortFunc(vols, func(a, b Volume) int { return strings.Compare(a.Path, b.Path) })
	return vols, nil
}

// CleanTemp deletes whatever interrupted writes left in the temporary directory of dir. Call it when
// nothing else writes to dir (at start-up): an Add or Remove running meanwhile may fail. A missing
// directory is not an error.
func CleanTemp(dir string) error {
	return os.RemoveAll(filepath.Join(dir, TempDirName))
}

// writeMountInfo puts data in place as the mountInfo.json of volumePath. A new volume directory is built
// in the temporary directory and renamed into place whole; in an existing one only the file is replaced,
// so the sandbox-id files stay.
func writeMountInfo(dir, volumePath string, data []byte) error {
	tmp, err := tempDir(dir)
	if err != nil {
		return err
	}
	volDir := filepath.Join(dir, VolumeDirName(volumePath))
	fi, err := os.Stat(volDir)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("%s: %w", volDir, syscall.ENOTDIR)
	case err == nil:
		return replaceMountInfo(volDir, tmp, data)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}

	staging, err := os.MkdirTemp(tmp, "add-") // mode 0700, as Kata makes volume directories
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(staging) }() // finds nothing after the rename
	if err := writeNewFile(filepath.Join(staging, MountInfoFileName), data); err != nil {
		return err
	}
	if err := syncDir(staging); err != nil {
		return err
	}
	if err := os.Rename(staging, volDir); err != nil {
		// Someone created the volume directory meanwhile (renaming onto an empty one succeeds).
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return replaceMountInfo(volDir, tmp, data)
		}
		return err
	}
	return syncDir(dir)
}

// replaceMountInfo atomically replaces the mountInfo.json of the existing volDir with data, preparing the
// new file in tmp. It leaves a file that already holds data with mode 0600 untouched.
func replaceMountInfo(volDir, tmp string, data []byte) error {
	name := filepath.Join(volDir, MountInfoFileName)
	if fi, err := os.Lstat(name); err == nil && fi.Mode() == fileMode {
		if old, err := os.ReadFile(name); err == nil && bytes.Equal(old, data) {
			return nil
		}
	}
	f, err := renameio.NewPendingFile(name, renameio.WithTempDir(tmp), renameio.WithStaticPermissions(fileMode))
	if err != nil {
		return err
	}
	defer func() { _ = f.Cleanup() }() // a no-op once replaced
	if _, err := f.Write(data); err != nil {
		return err
	}
	// This fsyncs the file, then renames it over the old one.
	if err := f.CloseAtomicallyReplace(); err != nil {
		return err
	}
	// renameio does not fsync the directory; without it the rename may not survive a crash.
	return syncDir(volDir)
}

// writeNewFile creates name with mode 0600 (whatever the umask), writes data and fsyncs it.
func writeNewFile(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return err
	}
	err = f.Chmod(fileMode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// tempDir makes sure dir and its temporary directory exist, and returns the latter.
func tempDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, TempDirName)
	if err := os.Mkdir(tmp, dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return tmp, nil
}

// syncDir fsyncs a directory, making the renames and creations in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
