package kata

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/safedir"
)

// TempDirName is the directory, inside the direct-volume directory, where this package prepares files and
// directories before renaming them into place. It starts with a dot, so it is never a volume directory.
const TempDirName = ".crust-tmp"

const (
	dirMode  = 0o700
	fileMode = 0o600
	// maxMountInfoSize bounds what Get reads of a mountInfo.json.
	maxMountInfoSize = 1 << 20
)

var (
	// ErrNotFound is returned for a volume that has no mountInfo.json (or, for SandboxIDs, no directory).
	ErrNotFound = errdefs.ErrNotFound
	// ErrInvalidSandboxID is returned by ForgetSandbox for an id that cannot be a file name.
	ErrInvalidSandboxID = errors.New("invalid sandbox id")
	// ErrForeignEntry is wrapped, with the path, by the error for an entry that is not what the format
	// puts at its place: a symbolic link anywhere (the direct-volume directory itself included), a
	// non-directory where a volume directory or the temporary directory belongs, anything but a regular
	// file at mountInfo.json. Such an entry is never written, read, moved or removed through; someone
	// other than the format's writers put it there.
	ErrForeignEntry = errdefs.New(errdefs.ErrFailedPrecondition, "not what the direct-volume format puts there")
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

// Dir is a direct-volume directory, opened once: every operation is done relative to it and never
// follows a symbolic link (see ErrForeignEntry). Its methods may be called concurrently for different
// volume paths; calls for one volume path must be serialised by the caller.
type Dir struct {
	d *safedir.Dir
	// durable says whether writes are fsynced (see WithoutSync).
	durable bool

	mu  sync.Mutex
	tmp *safedir.Dir // the temporary directory, opened on first use and kept; see tempDir
}

// Option changes how a Dir writes.
type Option func(*Dir)

// WithoutSync makes Add's writes atomic but not durable: a reader sees a volume's old mount info or its
// new one, never a part, but a crash of the machine may take a write back. It is for a writer that
// rebuilds the directory after a crash from durable state of its own (crustd's projection does at every
// start, from its store). Removals stay durable: a removal taken back would leave a volume nothing holds.
func WithoutSync() Option { return func(d *Dir) { d.durable = false } }

// OpenDir opens the direct-volume directory at path, creating it (mode 0700, as Kata does) when missing.
// It fails with ErrForeignEntry when a symbolic link is at path's place, and with an error wrapping
// safedir.ErrInsecure when another user owns the directory or may write in it: such a user could plant
// entries, so nothing is done there. A directory that others may read (Kata makes it 0700; kubelet's
// DirectoryOrCreate makes 0755) is accepted: each volume directory is 0700 and each mountInfo.json 0600.
func OpenDir(path string, opts ...Option) (*Dir, error) {
	if err := os.MkdirAll(path, dirMode); err != nil {
		return nil, err
	}
	return openDir(path, opts...)
}

// openDir opens the existing direct-volume directory at path and checks its owner and mode.
func openDir(path string, opts ...Option) (*Dir, error) {
	d, err := safedir.Open(path)
	if err != nil {
		return nil, foreign(err)
	}
	if err := d.CheckOwned(); err != nil {
		_ = d.Close()
		return nil, err
	}
	dir := &Dir{d: d, durable: true}
	for _, o := range opts {
		o(dir)
	}
	return dir, nil
}

// Path returns the path the directory was opened at.
func (d *Dir) Path() string { return d.d.Path() }

// Close closes the directory.
func (d *Dir) Close() error {
	d.mu.Lock()
	tmp := d.tmp
	d.tmp = nil
	d.mu.Unlock()
	if tmp != nil {
		_ = tmp.Close() // read-only descriptor of a directory: nothing to lose
	}
	return d.d.Close()
}

// withDir opens the direct-volume directory at path (creating it when create), runs fn on it and closes
// it. A directory that does not exist, when not created, returns missing.
func withDir(path string, create bool, missing error, fn func(*Dir) error) error {
	var (
		d   *Dir
		err error
	)
	if create {
		d, err = OpenDir(path)
	} else {
		d, err = openDir(path)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return missing
	}
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }() // nothing written through the directory's own descriptor
	return fn(d)
}

// Add records mountInfo, a JSON MountInfo, for volumePath under dir, as `kata-runtime direct-volume add`
// does: the file holds mountInfo byte for byte, and sandbox-id files already in the volume directory stay.
// mountInfo must decode with ParseMountInfo; otherwise Add fails with ErrInvalidMountInfo and creates
// nothing. Add is atomic and durable: after a crash the volume has either its old mount info (or none) or
// the new one. Adding the same mount info again changes nothing. Add opens dir as OpenDir does.
func Add(dir, volumePath, mountInfo string) error {
	if err := checkAdd(volumePath, mountInfo); err != nil {
		return err
	}
	return withDir(dir, true, nil, func(d *Dir) error { return d.Add(volumePath, mountInfo) })
}

// AddMountInfo is Add with info encoded as Kata encodes it.
func AddMountInfo(dir, volumePath string, info *MountInfo) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	return Add(dir, volumePath, string(data))
}

// Remove deletes the volume directory of volumePath under dir; see Dir.Remove. A dir that does not exist
// holds no volume.
func Remove(dir, volumePath string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	return withDir(dir, false, nil, func(d *Dir) error { return d.Remove(volumePath) })
}

// Get returns the mount info of volumePath under dir; see Dir.Get.
func Get(dir, volumePath string) (*MountInfo, error) {
	return readVolume(dir, volumePath, (*Dir).Get)
}

// SandboxIDs returns the sandbox ids recorded for volumePath under dir; see Dir.SandboxIDs.
func SandboxIDs(dir, volumePath string) ([]string, error) {
	return readVolume(dir, volumePath, (*Dir).SandboxIDs)
}

// readVolume checks volumePath and returns what read finds of it in the Dir at dir; a dir that does not
// exist holds no volume, so the answer then wraps ErrNotFound.
func readVolume[T any](dir, volumePath string, read func(*Dir, string) (T, error)) (v T, err error) {
	if err := checkVolumePath(volumePath); err != nil {
		return v, err
	}
	err = withDir(dir, false, notFound(volumePath), func(d *Dir) error {
		v, err = read(d, volumePath)
		return err
	})
	return v, err
}

// ForgetSandbox removes the record that sandboxID uses volumePath under dir; see Dir.ForgetSandbox.
func ForgetSandbox(dir, volumePath, sandboxID string) error {
	if err := errors.Join(checkVolumePath(volumePath), checkSandboxID(sandboxID)); err != nil {
		return err
	}
	return withDir(dir, false, nil, func(d *Dir) error { return d.ForgetSandbox(volumePath, sandboxID) })
}

// List returns every volume under dir; see Dir.List. A dir that does not exist holds no volumes.
func List(dir string) (vols []Volume, err error) {
	err = withDir(dir, false, nil, func(d *Dir) error {
		vols, err = d.List()
		return err
	})
	return vols, err
}

// CleanTemp empties the temporary directory under dir of what interrupted writes left; see
// Dir.CleanTemp. A missing dir is not an error.
func CleanTemp(dir string) error {
	return withDir(dir, false, nil, func(d *Dir) error { return d.CleanTemp() })
}

// Add records mountInfo for volumePath; see the package function Add.
func (d *Dir) Add(volumePath, mountInfo string) error {
	if err := checkAdd(volumePath, mountInfo); err != nil {
		return err
	}
	return d.writeMountInfo(VolumeDirName(volumePath), []byte(mountInfo))
}

// AddMountInfo is Add with info encoded as Kata encodes it.
func (d *Dir) AddMountInfo(volumePath string, info *MountInfo) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	data, err := json.Marshal(info) // what Kata decodes back into the same MountInfo: nothing to check
	if err != nil {
		return err
	}
	return d.writeMountInfo(VolumeDirName(volumePath), data)
}

// Remove deletes the volume directory of volumePath with everything in it, sandbox-id files included, as
// `kata-runtime direct-volume remove` does. A volume that is not there is not an error. Whatever else
// stands at the volume directory's place (a planted file or link) is removed the same way, itself and
// never what it points to, so that removing a volume heals its place. The directory disappears at once:
// it is first renamed into the temporary directory, then deleted.
func (d *Dir) Remove(volumePath string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	return d.inTemp(func(tmp *safedir.Dir) error {
		trash := safedir.TempName("remove-")
		name := VolumeDirName(volumePath)
		if err := d.d.RenameNoReplace(name, tmp, trash); err != nil {
			if _, lerr := d.d.Lstat(name); errors.Is(err, fs.ErrNotExist) && errors.Is(lerr, fs.ErrNotExist) {
				return nil // not there, or removed meanwhile
			}
			return err // the temporary directory may be gone: inTemp tries again
		}
		return errors.Join(d.d.Sync(), tmp.RemoveAll(trash))
	})
}

// Get returns the mount info of volumePath, decoded as Kata decodes it. It fails with ErrNotFound when
// the volume has no mountInfo.json, with ErrInvalidMountInfo when the file does not decode, and with
// ErrForeignEntry when the volume directory or the file is not of its kind (a link is never read
// through).
func (d *Dir) Get(volumePath string) (*MountInfo, error) {
	return readVolumeDir(d, volumePath, func(vol *safedir.Dir) (*MountInfo, error) {
		data, err := vol.ReadFile(MountInfoFileName, maxMountInfoSize)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound(volumePath)
		}
		if err != nil {
			return nil, foreign(err)
		}
		info, err := ParseMountInfo(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", vol.Join(MountInfoFileName), err)
		}
		return info, nil
	})
}

// SandboxIDs returns the name of every entry of the volume directory other than mountInfo.json, in name
// order, which is what Kata takes for sandbox ids (it uses the first). A volume with none returns an empty
// list; a volume directory that does not exist is ErrNotFound, and anything but a directory at its place
// ErrForeignEntry.
func (d *Dir) SandboxIDs(volumePath string) ([]string, error) {
	return readVolumeDir(d, volumePath, func(vol *safedir.Dir) ([]string, error) {
		names, err := vol.Names()
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, n := range names {
			if n != MountInfoFileName {
				ids = append(ids, n)
			}
		}
		return ids, nil
	})
}

// readVolumeDir checks volumePath and returns what read finds in its volume directory, opened for the
// call and only read.
func readVolumeDir[T any](d *Dir, volumePath string, read func(vol *safedir.Dir) (T, error)) (v T, err error) {
	if err := checkVolumePath(volumePath); err != nil {
		return v, err
	}
	vol, err := d.openVolume(volumePath)
	if err != nil {
		return v, err
	}
	defer func() { _ = vol.Close() }() // read-only
	return read(vol)
}

// ForgetSandbox removes the sandbox-id file sandboxID from the volume directory of volumePath, as Kata
// does when the sandbox goes away; it is how a claim recorded by a Kata shim is released by force. An
// id or a volume that is not there is not an error; an id that is not a plain file name is
// ErrInvalidSandboxID; a volume directory or an id entry not of its kind is ErrForeignEntry.
func (d *Dir) ForgetSandbox(volumePath, sandboxID string) error {
	if err := errors.Join(checkVolumePath(volumePath), checkSandboxID(sandboxID)); err != nil {
		return err
	}
	vol, err := d.openVolume(volumePath)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = vol.Close() }()
	if err := vol.Remove(sandboxID); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return foreign(err)
	}
	return vol.Sync()
}

// checkSandboxID is ErrInvalidSandboxID for an id that is not a plain file name of the volume directory
// other than mountInfo.json.
func checkSandboxID(id string) error {
	if id == "" || id == "." || id == ".." || id == MountInfoFileName || strings.ContainsAny(id, "/\x00") || len(id) > maxNameLen {
		return fmt.Errorf("%w: %q", ErrInvalidSandboxID, id)
	}
	return nil
}

// List returns every volume, ordered by path. Entries that Kata would not take for a volume are skipped:
// anything that is not a directory (a link included), a name that ParseVolumeDirName refuses (such as
// TempDirName), and a directory without a mountInfo.json (a regular file) that decodes.
func (d *Dir) List() ([]Volume, error) {
	names, err := d.d.Names()
	if err != nil {
		return nil, err
	}
	var vols []Volume
	for _, name := range names {
		path, err := ParseVolumeDirName(name)
		if err != nil {
			continue
		}
		info, err := d.Get(path)
		if err != nil {
			continue
		}
		ids, err := d.SandboxIDs(path)
		if err != nil {
			continue // removed meanwhile
		}
		vols = append(vols, Volume{Path: path, MountInfo: *info, SandboxIDs: ids})
	}
	slices.SortFunc(vols, func(a, b Volume) int { return strings.Compare(a.Path, b.Path) })
	return vols, nil
}

// CleanTemp deletes whatever interrupted writes left in the temporary directory and leaves it empty (a
// link or anything else at its place is removed, never followed, and the directory made anew), so that
// the directory's shape after a start does not depend on whether anything was written since. Call it
// when nothing else writes to the directory (at start-up): an Add or Remove running meanwhile may fail.
func (d *Dir) CleanTemp() error {
	d.dropTemp()
	err := d.d.RemoveAll(TempDirName)
	if err == nil {
		_, err = d.tempDir()
	}
	return errors.Join(err, d.d.Sync())
}

// checkAdd checks Add's input before anything is created.
func checkAdd(volumePath, mountInfo string) error {
	if err := checkVolumePath(volumePath); err != nil {
		return err
	}
	_, err := ParseMountInfo([]byte(mountInfo))
	return err
}

// writeMountInfo puts data in place as the mountInfo.json of the volume directory name. A new volume
// directory is built in the temporary directory and renamed into place whole; in an existing one only the
// file is replaced, so the sandbox-id files stay.
func (d *Dir) writeMountInfo(name string, data []byte) error {
	// One read of the file where it stands, without opening its directory: a volume written again
	// mostly finds it as it should be (every volume at each start of crustd), a new one finds nothing.
	old, fi, err := d.d.ReadFileBeneath(name+"/"+MountInfoFileName, maxMountInfoSize)
	if err == nil && fi.Mode() == fileMode && bytes.Equal(old, data) {
		return nil
	}
	// With nothing there the directory is built anew; one that stands without its file is found by the
	// rename into place, and mended then.
	if !errors.Is(err, fs.ErrNotExist) {
		vol, err := d.d.OpenDir(name)
		if err == nil {
			defer func() { _ = vol.Close() }()
			return d.inTemp(func(tmp *safedir.Dir) error { return d.replaceMountInfo(vol, tmp, data) })
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return foreign(err)
		}
	}
	return d.inTemp(func(tmp *safedir.Dir) error {
		staging, stage, err := tmp.MkdirTemp("add-") // mode 0700, as Kata makes volume directories
		if err != nil {
			return err
		}
		placed := false
		defer func() {
			if !placed {
				_ = tmp.RemoveAll(staging)
			}
		}()
		// The staging directory is unseen until it is renamed into place, so the file is written in it
		// directly.
		err = stage.WriteNew(MountInfoFileName, data, fileMode, d.durable)
		_ = stage.Close()
		if err != nil {
			return err
		}
		err = tmp.RenameNoReplace(staging, d.d, name)
		placed = err == nil
		if err != nil {
			if !errors.Is(err, fs.ErrExist) {
				return err
			}
			// The volume directory is there, without its file or made meanwhile.
			vol, err := d.d.OpenDir(name)
			if err != nil {
				return foreign(err)
			}
			defer func() { _ = vol.Close() }()
			return d.replaceMountInfo(vol, tmp, data)
		}
		if !d.durable {
			return nil
		}
		return d.d.Sync()
	})
}

// replaceMountInfo atomically replaces the mountInfo.json of the volume directory vol with data,
// preparing the new file in tmp. It leaves a file that already holds data with mode 0600 untouched.
func (d *Dir) replaceMountInfo(vol, tmp *safedir.Dir, data []byte) error {
	// Whatever else keeps the file from being read (not there, too large, unreadable) is mended by the
	// write, or the write says what stops it.
	old, fi, err := vol.ReadFileInfo(MountInfoFileName, maxMountInfoSize)
	switch {
	case errors.Is(err, safedir.ErrWrongType):
		return foreign(err)
	case err == nil && fi.Mode() == fileMode && bytes.Equal(old, data):
		return nil
	}
	if !d.durable {
		return foreign(vol.WriteFileAtomic(MountInfoFileName, data, fileMode, tmp))
	}
	// Fsyncs the new file, renames it over the old one and fsyncs the volume directory.
	return foreign(vol.WriteFile(MountInfoFileName, data, fileMode, tmp))
}

// openVolume opens the volume directory of volumePath: ErrNotFound when there is none, ErrForeignEntry
// when something else is at its place.
func (d *Dir) openVolume(volumePath string) (*safedir.Dir, error) {
	vol, err := d.d.OpenDir(VolumeDirName(volumePath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFound(volumePath)
	}
	if err != nil {
		return nil, foreign(err)
	}
	return vol, nil
}

// inTemp runs fn with the temporary directory (see tempDir). When fn fails because something is not
// there, the directory may be gone (an operator cleared it): fn runs once more with the directory opened
// anew, and that answer stands. Any other failure (a failed fsync among them) is fn's answer.
func (d *Dir) inTemp(fn func(tmp *safedir.Dir) error) error {
	tmp, err := d.tempDir()
	if err != nil {
		return err
	}
	if err = fn(tmp); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	d.dropTemp()
	if tmp, err = d.tempDir(); err != nil {
		return err
	}
	return fn(tmp)
}

// tempDir returns the temporary directory, opened on first use, created when missing, and kept until
// dropTemp; callers do not close it.
//
// The name is this package's own, so whatever else stands there (a planted link or file) is removed,
// itself and never what it points to, and the directory made anew: a planted entry cannot stop writes.
func (d *Dir) tempDir() (*safedir.Dir, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tmp != nil {
		return d.tmp, nil
	}
	tmp, err := d.d.EnsureDir(TempDirName, dirMode)
	if errors.Is(err, safedir.ErrWrongType) {
		if rerr := d.d.RemoveAll(TempDirName); rerr != nil {
			return nil, foreign(err)
		}
		tmp, err = d.d.EnsureDir(TempDirName, dirMode)
	}
	if err != nil {
		return nil, foreign(err)
	}
	d.tmp = tmp
	return tmp, nil
}

// dropTemp forgets the kept temporary directory; the next tempDir opens it anew. A call in flight that
// uses the old one keeps its descriptor: it is closed by the garbage collector, not here.
func (d *Dir) dropTemp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tmp = nil
}

func notFound(volumePath string) error {
	return fmt.Errorf("direct volume %q: %w", volumePath, ErrNotFound)
}

// foreign adds ErrForeignEntry to an error that says an entry is of the wrong kind.
func foreign(err error) error {
	if errors.Is(err, safedir.ErrWrongType) {
		return fmt.Errorf("%w: %w", err, ErrForeignEntry)
	}
	return err
}
