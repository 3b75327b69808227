// Package safedir works in a directory that someone else might also write in, without ever being led
// elsewhere by what they put there. A Dir is a directory opened once; every operation names one entry
// of it and is done relative to the open directory, never following a symbolic link: a link, or a file
// where a directory is expected (or the reverse), is refused with an error wrapping ErrWrongType and
// nothing is written, read, changed or removed through it. It depends on nothing else of crust.
//
// Only the directory given to Open is reached by path, and only its last element must not be a link (the
// path up to it is the operator's choice). Below it, entries are reached one name at a time with
// openat2(2) RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH, O_NOFOLLOW, fstatat(2) AT_SYMLINK_NOFOLLOW, and the
// *at(2) calls for creating, renaming and removing, which never follow a link in the name they act on.
//
// Why not a library: Go's os.Root and github.com/cyphar/filepath-securejoin keep resolution inside a
// root, but they follow links that stay inside it, and a link planted by another user inside the
// directory is exactly what must not be followed here. Both would also hide from the caller that an
// entry is not what its format puts there, which callers must report.
package safedir

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

var (
	// ErrWrongType is wrapped by the error for an entry that is not of the kind the operation needs: a
	// symbolic link, a non-directory where a directory is needed, a directory or a special file where a
	// regular file is needed.
	ErrWrongType = errors.New("unexpected kind of entry")
	// ErrTooLarge is wrapped by ReadFile's error for a file larger than the limit it was given.
	ErrTooLarge = errors.New("file too large")
	// ErrInsecure is wrapped by CheckOwned's error for a directory that another user owns or may write in.
	ErrInsecure = errors.New("owned or writable by another user")
)

// resolve is how every entry is reached: never through a link, never outside the directory.
const resolve = unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

// Dir is an open directory. Its methods may be called concurrently; Close must come last.
type Dir struct {
	fd      int             // the open directory (a bare descriptor: no os.File, whose set-up costs system calls)
	closed  atomic.Bool     // so that a second Close cannot close a descriptor reused since
	cleanup runtime.Cleanup // closes fd when a Dir nobody closed is collected, as an os.File's would
	path    string          // for messages only
	sync    syncGroup
}

// newDir returns the Dir of the open directory fd, whose descriptor is closed by Close or, failing that,
// when the Dir is garbage collected.
func newDir(fd int, path string) *Dir {
	d := &Dir{fd: fd, path: path}
	d.cleanup = runtime.AddCleanup(d, func(fd int) { _ = unix.Close(fd) }, fd)
	return d
}

// Open opens the existing directory at path. The last element of path must not be a symbolic link.
func Open(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) {
		// O_DIRECTORY answers for a link too; say which it is.
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			err = unix.ELOOP
		}
	}
	if err != nil {
		return nil, pathErr("open", path, err, true)
	}
	return newDir(fd, path), nil
}

// OpenOwned opens the directory at path for a daemon's own state: it creates it (mode 0700, its parent
// fsynced) when missing, and fails with ErrInsecure when another user owns it or may write in it (see
// CheckOwned). An existing directory keeps its mode: one that others may read and search but not write
// (0755) is accepted, because the daemon's socket may live there for callers of other uids.
func OpenOwned(path string) (*Dir, error) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(path, 0o700); err != nil {
			return nil, err
		}
		if err := syncPath(filepath.Dir(path)); err != nil {
			return nil, err
		}
	}
	d, err := Open(path)
	if err != nil {
		return nil, err
	}
	if err := d.CheckOwned(); err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// syncPath fsyncs the directory at path.
func syncPath(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// Path returns the path the directory was opened at (or, for a subdirectory, its path below that).
func (d *Dir) Path() string { return d.path }

// Join returns the path of the entry name, for messages.
func (d *Dir) Join(name string) string { return filepath.Join(d.path, name) }

// Close closes the directory. A second Close is an error wrapping fs.ErrClosed.
func (d *Dir) Close() error {
	if d.closed.Swap(true) {
		return pathErr("close", d.path, fs.ErrClosed, false)
	}
	d.cleanup.Stop()
	if err := unix.Close(d.fd); err != nil {
		return pathErr("close", d.path, err, false)
	}
	return nil
}

// Sync makes the creations, renames and removals of entries made before it was called durable: it
// returns once an fsync of the directory that began after the call has ended, with that fsync's error.
// Calls that overlap share fsyncs (a group commit): while one runs, every call that comes waits for the
// next, which one of them runs for all, so N concurrent writers pay about two fsyncs, not N.
func (d *Dir) Sync() error {
	g := &d.sync
	g.mu.Lock()
	defer g.mu.Unlock()
	need := g.started + 1 // the first fsync to begin from now on
	for g.finished < need {
		if g.running {
			if g.done == nil {
				g.done = sync.NewCond(&g.mu)
			}
			g.done.Wait()
			continue
		}
		g.running = true
		g.started++
		gen := g.started
		g.mu.Unlock()
		err := fsync(d.fd)
		g.mu.Lock()
		g.running = false
		g.finished, g.err = gen, err
		if g.done != nil {
			g.done.Broadcast()
		}
	}
	// g.err is that of the latest fsync to end, which began after this call did whatever its generation.
	if g.err != nil {
		return pathErr("sync", d.path, g.err, false)
	}
	return nil
}

// syncGroup is the state of a Dir's group commit (see Sync).
type syncGroup struct {
	mu                sync.Mutex
	done              *sync.Cond // signalled when an fsync ends; made on first wait
	started, finished uint64     // generations of fsyncs begun and of the latest one ended
	running           bool
	err               error // of the latest fsync to end
}

// CheckOwned fails with ErrInsecure, naming the path, the owner and the mode, unless the directory is
// owned by this process's effective user id and neither its group nor others may write in it: only then
// can no one else plant or swap an entry in it.
func (d *Dir) CheckOwned() error {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return pathErr("stat", d.path, err, false)
	}
	if euid := os.Geteuid(); int(st.Uid) != euid || st.Mode&0o022 != 0 {
		return fmt.Errorf("directory %s is owned by uid %d with mode %04o: %w; it must be owned by uid %d and writable by it alone",
			d.path, st.Uid, st.Mode&0o7777, ErrInsecure, euid)
	}
	return nil
}

// OpenDir opens the subdirectory name.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	fd, err := d.openat("open", name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	return newDir(fd, d.Join(name)), nil
}

// Mkdir creates the subdirectory name with mode perm, whatever the umask. An existing entry is an error
// wrapping fs.ErrExist.
func (d *Dir) Mkdir(name string, perm fs.FileMode) error {
	sub, err := d.MkdirOpen(name, perm)
	if err != nil {
		return err
	}
	return sub.Close()
}

// MkdirOpen is Mkdir returning the new directory, opened.
func (d *Dir) MkdirOpen(name string, perm fs.FileMode) (*Dir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := unix.Mkdirat(d.fd, name, 0o700); err != nil {
		return nil, pathErr("mkdir", d.Join(name), err, false)
	}
	// Mkdirat is subject to the umask; the mode is set on the directory opened without following links.
	return d.openMode(name, perm)
}

// openMode opens the subdirectory name and gives it mode perm.
func (d *Dir) openMode(name string, perm fs.FileMode) (*Dir, error) {
	sub, err := d.OpenDir(name)
	if err != nil {
		return nil, err
	}
	if err := sub.chmod(perm); err != nil {
		_ = sub.Close()
		return nil, err
	}
	return sub, nil
}

func (d *Dir) chmod(perm fs.FileMode) error {
	if err := ignoringEINTR(func() error { return unix.Fchmod(d.fd, uint32(perm.Perm())) }); err != nil {
		return pathErr("chmod", d.path, err, false)
	}
	return nil
}

// EnsureDir opens the subdirectory name, creating it when missing, and gives it mode perm.
func (d *Dir) EnsureDir(name string, perm fs.FileMode) (*Dir, error) {
	sub, err := d.MkdirOpen(name, perm)
	if !errors.Is(err, fs.ErrExist) {
		return sub, err
	}
	return d.openMode(name, perm)
}

// MkdirTemp creates a new subdirectory, mode 0700, whose name starts with prefix, and returns its name and
// the directory, opened.
func (d *Dir) MkdirTemp(prefix string) (string, *Dir, error) {
	for {
		name := TempName(prefix)
		sub, err := d.MkdirOpen(name, 0o700)
		if !errors.Is(err, fs.ErrExist) {
			return name, sub, err
		}
	}
}

// TempName returns prefix followed by 16 random hex digits: a name no other call returns.
//
// The digits come from the runtime's generator (seeded from the system's entropy, as os.CreateTemp's
// are), not from crypto/rand, which on kernels before 6.11 (no getrandom in the vDSO) costs a getrandom(2)
// call a name: a name only has to be new, and every caller creates or renames to it exclusively, so that
// an entry already there is never used.
func TempName(prefix string) string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return prefix + hex.EncodeToString(b[:])
}

// OpenFile opens the regular file name with flag (os.O_RDONLY, os.O_WRONLY|os.O_CREATE, ...); a file
// it creates gets mode perm, whatever the umask. Anything but a regular file is refused with
// ErrWrongType, before a byte is read or written (a FIFO does not block the open).
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := d.openat("open", name, flag|unix.O_NONBLOCK, uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return nil, pathErr("stat", d.Join(name), err, false)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w: %s", d.Join(name), ErrWrongType, Kind((&fileInfo{st: st}).Mode()))
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		_ = unix.Close(fd)
		return nil, pathErr("open", d.Join(name), err, false)
	}
	if flag&os.O_CREATE != 0 {
		if err := giveMode(fd, &st, perm); err != nil {
			_ = unix.Close(fd)
			return nil, pathErr("chmod", d.Join(name), err, false)
		}
	}
	return os.NewFile(uintptr(fd), d.Join(name)), nil
}

// giveMode gives the file fd, which st describes, mode perm when the umask took bits of it away as it was
// created. A file another user owns is left as it is.
func giveMode(fd int, st *unix.Stat_t, perm fs.FileMode) error {
	if os.FileMode(st.Mode).Perm() == perm.Perm() || int(st.Uid) != os.Geteuid() {
		return nil
	}
	return ignoringEINTR(func() error { return unix.Fchmod(fd, uint32(perm.Perm())) })
}

// ReadFile returns the content of the regular file name, failing with an error wrapping ErrTooLarge when
// it holds more than limit bytes (of which it reads at most limit+1). Anything but a regular file is
// refused with ErrWrongType before a byte is read (a FIFO does not block the open).
func (d *Dir) ReadFile(name string, limit int64) ([]byte, error) {
	data, _, err := d.ReadFileInfo(name, limit)
	return data, err
}

// ReadFileInfo is ReadFile that also describes the file it read (its mode and owner), as it was when
// opened: what a caller learns of it this way cannot have changed between a stat and the read.
func (d *Dir) ReadFileInfo(name string, limit int64) ([]byte, fs.FileInfo, error) {
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	return d.readFile(name, limit)
}

// ReadFileBeneath is ReadFileInfo for a file further below d, named by a relative path such as
// "sub/file": no element of the path may be a symbolic link (ErrWrongType) or climb out of d
// (fs.ErrInvalid). It saves opening each directory on the way when only the file is wanted.
func (d *Dir) ReadFileBeneath(rel string, limit int64) ([]byte, fs.FileInfo, error) {
	if !filepath.IsLocal(rel) || strings.Contains(rel, "\x00") {
		return nil, nil, fmt.Errorf("%q is not a relative path below %s: %w", rel, d.path, fs.ErrInvalid)
	}
	return d.readFile(rel, limit)
}

// readFile is ReadFileInfo of a name or a relative path below d that the caller checked.
func (d *Dir) readFile(name string, limit int64) ([]byte, fs.FileInfo, error) {
	fd, err := d.openBeneath("open", name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = unix.Close(fd) }() // read-only: nothing to lose
	fi := &fileInfo{name: filepath.Base(name)}
	if err := unix.Fstat(fd, &fi.st); err != nil {
		return nil, nil, pathErr("stat", d.Join(name), err, false)
	}
	if fi.st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("open %s: %w: %s", d.Join(name), ErrWrongType, Kind(fi.Mode()))
	}
	// A regular file ignores O_NONBLOCK, and a read of one is short only at its end: a read that fills
	// less than the buffer, which is one byte larger than the file, took the rest of it.
	buf := make([]byte, min(fi.st.Size, limit)+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, pathErr("read", d.Join(name), err, false)
		}
		n += m
		if m == 0 || n < len(buf) {
			break
		}
	}
	if int64(n) > limit {
		return nil, nil, fmt.Errorf("read %s: %w: more than %d bytes", d.Join(name), ErrTooLarge, limit)
	}
	return buf[:n], fi, nil
}

// WriteFile puts data at name atomically and durably, with mode perm: it writes a new file in tmp (a
// directory on the same filesystem), fsyncs it, renames it over name and fsyncs this directory. Whatever
// happens, name holds its old content or data. A link at name is replaced, never written through; a
// directory at name is ErrWrongType.
func (d *Dir) WriteFile(name string, data []byte, perm fs.FileMode, tmp *Dir) error {
	return d.writeFile(name, data, perm, tmp, true)
}

// WriteFileAtomic is WriteFile without its fsyncs: the replacement is atomic (a reader sees the old
// content or the new, never a part) but not durable (a crash of the machine may take it back). It is for
// a file its writer rebuilds after a crash from durable state of its own.
func (d *Dir) WriteFileAtomic(name string, data []byte, perm fs.FileMode, tmp *Dir) error {
	return d.writeFile(name, data, perm, tmp, false)
}

func (d *Dir) writeFile(name string, data []byte, perm fs.FileMode, tmp *Dir, durable bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	tmpName, fd, err := tmp.createTemp("w-", perm)
	if err != nil {
		return err
	}
	if err = fill(fd, data, durable); err != nil {
		err = pathErr("write", tmp.Join(tmpName), err, false)
	} else {
		err = tmp.Rename(tmpName, d, name)
	}
	if err != nil {
		_ = tmp.Remove(tmpName)
		return err
	}
	if !durable {
		return nil
	}
	return d.Sync()
}

// WriteNew creates the regular file name holding data, with mode perm whatever the umask; an existing
// entry (a link included) is an error wrapping fs.ErrExist, and is left as it is. With durable, the file
// and the directory are fsynced before it returns. A failed write removes the file it created.
func (d *Dir) WriteNew(name string, data []byte, perm fs.FileMode, durable bool) error {
	fd, err := d.create(name, perm)
	if err != nil {
		return err
	}
	if err := fill(fd, data, durable); err != nil {
		_ = d.Remove(name)
		return pathErr("write", d.Join(name), err, false)
	}
	if !durable {
		return nil
	}
	return d.Sync()
}

// createTemp creates a new regular file (create) whose name is prefix and a TempName suffix.
func (d *Dir) createTemp(prefix string, perm fs.FileMode) (string, int, error) {
	for {
		name := TempName(prefix)
		fd, err := d.create(name, perm)
		if !errors.Is(err, fs.ErrExist) {
			return name, fd, err
		}
	}
}

// create creates the regular file name, open for writing with mode perm whatever the umask. Created with
// O_EXCL, it cannot be anything but the new file.
func (d *Dir) create(name string, perm fs.FileMode) (int, error) {
	fd, err := d.openat("open", name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, uint32(perm.Perm()))
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil {
		err = giveMode(fd, &st, perm)
	}
	if err != nil {
		_ = unix.Close(fd)
		_ = d.Remove(name)
		return -1, pathErr("create", d.Join(name), err, false)
	}
	return fd, nil
}

// fill writes data whole to fd, fsyncs it when durable, and closes it.
func fill(fd int, data []byte, durable bool) error {
	err := writeAll(fd, data)
	if err == nil && durable {
		err = fsync(fd)
	}
	return errors.Join(err, unix.Close(fd))
}

// writeAll writes data whole to fd.
func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// fsync fsyncs fd.
func fsync(fd int) error { return ignoringEINTR(func() error { return unix.Fsync(fd) }) }

// ignoringEINTR calls fn until it fails with something other than EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// Rename moves the entry from of d to name in to, replacing what is there (the entry itself when it is a
// link). A directory cannot replace a non-empty directory or a non-directory, nor a file a directory.
func (d *Dir) Rename(from string, to *Dir, name string) error { return d.rename(from, to, name, 0) }

// RenameNoReplace is Rename failing with fs.ErrExist when name exists in to.
func (d *Dir) RenameNoReplace(from string, to *Dir, name string) error {
	return d.rename(from, to, name, unix.RENAME_NOREPLACE)
}

func (d *Dir) rename(from string, to *Dir, name string, flags uint) error {
	if err := errors.Join(checkName(from), checkName(name)); err != nil {
		return err
	}
	if err := unix.Renameat2(d.fd, from, to.fd, name, flags); err != nil {
		return &os.LinkError{Op: "rename", Old: d.Join(from), New: to.Join(name), Err: wrongType(err)}
	}
	return nil
}

// Remove deletes the entry name when it is not a directory (a link is removed, not what it points to). A
// name that is not there is an error wrapping fs.ErrNotExist.
func (d *Dir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, 0); err != nil {
		return pathErr("remove", d.Join(name), err, true)
	}
	return nil
}

// RemoveEmptyDir deletes the directory name when it is empty; a directory that is not (ENOTEMPTY), or a
// name that is not there, is an error.
func (d *Dir) RemoveEmptyDir(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR); err != nil {
		return pathErr("remove", d.Join(name), err, true)
	}
	return nil
}

// RemoveAll deletes the entry name and, for a directory, everything in it, never following a link. A
// name that is not there is not an error.
func (d *Dir) RemoveAll(name string) error {
	err := d.Remove(name)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !errors.Is(err, ErrWrongType) { // unlink(2) refuses a directory with EISDIR
		return err
	}
	sub, err := d.OpenDir(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// sub is this call's own open file description: its names are read on it, not on a new one.
	names, err := sub.readNames(sub.fd)
	for _, n := range names {
		err = errors.Join(err, sub.RemoveAll(n))
	}
	if err = errors.Join(err, sub.Close()); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return pathErr("remove", d.Join(name), err, false)
	}
	return nil
}

// Names returns the names of the directory's entries, sorted, without "." and "..".
func (d *Dir) Names() ([]string, error) {
	// A new open file description, so that concurrent listings do not share a read offset.
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr("open", d.path, err, false)
	}
	defer func() { _ = unix.Close(fd) }() // read-only
	return d.readNames(fd)
}

// readNames returns the names of the entries of the open directory fd, read from its offset, sorted.
func (d *Dir) readNames(fd int) ([]string, error) {
	var names []string
	buf := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(buf)
	for {
		n, err := unix.ReadDirent(fd, *buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, pathErr("readdirent", d.path, err, false)
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent((*buf)[:n], -1, names)
	}
	slices.Sort(names)
	return names, nil
}

// direntBufs holds the buffers Names reads directory entries into.
var direntBufs = sync.Pool{New: func() any { b := make([]byte, 8192); return &b }}

// Lstat describes the entry name itself (a link is described, not followed).
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, pathErr("lstat", d.Join(name), err, false)
	}
	return &fileInfo{name: name, st: st}, nil
}

// Readlink returns the target of the symbolic link name, without following it.
func (d *Dir) Readlink(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(d.fd, name, buf)
	if err != nil {
		return "", pathErr("readlink", d.Join(name), err, false)
	}
	return string(buf[:n]), nil
}

// Symlink makes name a new symbolic link to target, which is stored as it is and never resolved here.
func (d *Dir) Symlink(target, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Symlinkat(target, d.fd, name); err != nil {
		return pathErr("symlink", d.Join(name), err, false)
	}
	return nil
}

// openat opens name with openat2, never through a link and never outside d.
func (d *Dir) openat(op, name string, flag int, perm uint32) (int, error) {
	if err := checkName(name); err != nil {
		return -1, err
	}
	return d.openBeneath(op, name, flag, perm)
}

// openBeneath is openat of a name or of a relative path below d that the caller checked.
func (d *Dir) openBeneath(op, name string, flag int, perm uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flag | unix.O_NOFOLLOW | unix.O_CLOEXEC), Resolve: resolve}
	if flag&unix.O_CREAT != 0 {
		how.Mode = uint64(perm)
	}
	for {
		fd, err := unix.Openat2(d.fd, name, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) { // EAGAIN: a rename raced the lookup
			continue
		}
		if (errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO)) && !strings.Contains(name, "/") {
			// The first two answer for a link and for a non-directory, the last for a socket (and a device
			// without a driver); say which it is (of a single name: a stat of a longer path could pass
			// through a link).
			var st unix.Stat_t
			if unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				return -1, fmt.Errorf("%s %s: %w: %s", op, d.Join(name), ErrWrongType, Kind((&fileInfo{st: st}).Mode()))
			}
		}
		if err != nil {
			return -1, pathErr(op, d.Join(name), err, true)
		}
		return fd, nil
	}
}

// checkName refuses a name that is not exactly one entry of a directory.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%q is not a directory entry name: %w", name, fs.ErrInvalid)
	}
	return nil
}

// pathErr wraps err as a *fs.PathError; with kinds, the errors that say an entry is of the wrong kind
// (a link where none may be, a non-directory or a directory) also wrap ErrWrongType.
func pathErr(op, path string, err error, kinds bool) error {
	if kinds {
		err = wrongType(err)
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// wrongTypeErr is an errno that also matches ErrWrongType.
type wrongTypeErr struct {
	errno unix.Errno
	what  string
}

func (e wrongTypeErr) Error() string   { return ErrWrongType.Error() + ": " + e.what }
func (e wrongTypeErr) Unwrap() []error { return []error{ErrWrongType, e.errno} }

func wrongType(err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case unix.ELOOP:
		return wrongTypeErr{errno, "a symbolic link"}
	case unix.ENOTDIR:
		return wrongTypeErr{errno, "not a directory"}
	case unix.EISDIR:
		return wrongTypeErr{errno, "a directory"}
	}
	return err
}

// Kind describes the kind of entry of mode for messages: "a symbolic link", "a directory", "a regular
// file", "a FIFO", "a socket", "a device node".
func Kind(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeSymlink != 0:
		return "a symbolic link"
	case mode.IsDir():
		return "a directory"
	case mode.IsRegular():
		return "a regular file"
	case mode&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeDevice != 0:
		return "a device node"
	}
	return "an entry of unknown kind"
}

// fileInfo is an fs.FileInfo from fstatat; Sys returns the *unix.Stat_t.
type fileInfo struct {
	name string
	st   unix.Stat_t
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.st.Size }
func (fi *fileInfo) ModTime() time.Time { return time.Unix(fi.st.Mtim.Unix()) }
func (fi *fileInfo) IsDir() bool        { return fi.st.Mode&unix.S_IFMT == unix.S_IFDIR }
func (fi *fileInfo) Sys() any           { return &fi.st }

func (fi *fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(fi.st.Mode & 0o777)
	switch fi.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if fi.st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if fi.st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if fi.st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}
