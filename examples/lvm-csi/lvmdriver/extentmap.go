package lvmdriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"crust.dev/crust/examples/lvm-csi/internal/lvm"
)

// extentMap is ActivationExtentMap: each active logical volume is a file on a private FUSE mount whose
// bytes are the volume's extents on the physical volumes, attached to a loop device; /dev/<vg>/<lv> links
// to the loop device. Reads and writes go straight to the physical volume (FOPEN_DIRECT_IO, no page
// cache), so what a volume holds is exactly what LVM's extents hold.
type extentMap struct {
	vg    string
	lvm   *lvm.Runner
	dir   string // the FUSE mount point
	log   *slog.Logger
	root  *fs.Inode
	srv   *fuse.Server
	mu    sync.Mutex
	pvs   map[string]*os.File // open physical volumes, by path
	vols  map[string]*lvFile  // active volumes, by name
	loops map[string]string   // loop device, by volume name
	ino   uint64
}

type extentRoot struct{ fs.Inode }

// closeFUSEOnExec marks every descriptor of /dev/fuse in this process close-on-exec.
func closeFUSEOnExec() error {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err != nil || l != "/dev/fuse" {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			return err
		}
		syscall.CloseOnExec(fd)
	}
	return nil
}

// newExtentMap mounts the FUSE file system at dir (made if missing).
func newExtentMap(vg string, r *lvm.Runner, dir string, log *slog.Logger) (*extentMap, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	zero := time.Duration(0)
	root := &extentRoot{}
	// go-fuse opens /dev/fuse without close-on-exec for a direct mount. Holding ForkLock (what it is for)
	// until the descriptor is marked keeps every child of this process (mkfs, resize2fs, a proxy a test
	// starts) from inheriting it: a child holding it would keep the connection alive, unanswered, after
	// the driver is gone, and hang whatever touches a loop device on it. DirectMountStrict: no fallback
	// to fusermount, which would fork under the lock.
	syscall.ForkLock.Lock()
	srv, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName: "crust-extent-map", Name: "crustlv", DirectMountStrict: true, DisableXAttrs: true,
			MaxWrite: 1 << 20, DisableSplice: true, Logger: stdlog.New(io.Discard, "", 0),
		},
	})
	if err == nil {
		err = closeFUSEOnExec()
	}
	syscall.ForkLock.Unlock()
	if err != nil {
		if srv != nil {
			_ = srv.Unmount()
		}
		return nil, fmt.Errorf("mount the extent map at %s: %w", dir, err)
	}
	return &extentMap{
		vg: vg, lvm: r, dir: dir, log: log, root: root.EmbeddedInode(), srv: srv,
		pvs: map[string]*os.File{}, vols: map[string]*lvFile{}, loops: map[string]string{},
	}, nil
}

func (m *extentMap) path(name string) string { return filepath.Join("/dev", m.vg, name) }

func (m *extentMap) activate(ctx context.Context, lv *lvm.LV, fresh bool) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.loops[lv.Name]; ok {
		// Active already, perhaps since before another process (the controller) extended the volume:
		// the device must show the volume's size now, as a device-mapper device would.
		if f := m.vols[lv.Name]; f.sizeNow() != lv.Size {
			if err := m.refreshLocked(ctx, lv); err != nil {
				return "", err
			}
		}
		return m.path(lv.Name), nil
	}
	exts, err := m.extents(ctx, lv)
	if err != nil {
		return "", err
	}
	f, ok := m.vols[lv.Name]
	if ok {
		f.set(exts, lv.Size) // left from an activation that failed half-way: take LVM's map again
	} else {
		f = &lvFile{}
		f.set(exts, lv.Size)
		m.ino++
		node := m.root.NewPersistentInode(ctx, f, fs.StableAttr{Mode: fuse.S_IFREG, Ino: 1<<32 + m.ino})
		m.root.AddChild(lv.Name, node, true)
		m.vols[lv.Name] = f
	}
	if fresh {
		if err := f.zeroEnds(1 << 20); err != nil {
			return "", fmt.Errorf("zero %s: %w", lv.Name, err)
		}
	}
	file := filepath.Join(m.dir, lv.Name)
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup %s: %v: %s", file, err, strings.TrimSpace(string(out)))
	}
	loop := strings.TrimSpace(string(out))
	m.loops[lv.Name] = loop
	link := m.path(lv.Name)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return "", err
	}
	_ = os.Remove(link)
	if err := os.Symlink(loop, link); err != nil {
		return "", err
	}
	m.log.Debug("activated", "lv", lv.Name, "loop", loop, "bytes", lv.Size, "segments", len(lv.Segments))
	return link, nil
}

// extents maps lv's segments onto open physical volumes.
func (m *extentMap) extents(ctx context.Context, lv *lvm.LV) ([]extent, error) {
	vg, err := m.lvm.VG(ctx, m.vg)
	if err != nil {
		return nil, err
	}
	starts, err := m.lvm.PEStarts(ctx, m.vg)
	if err != nil {
		return nil, err
	}
	var exts []extent
	for _, s := range lv.Segments {
		if s.Type != "linear" && s.Type != "striped" {
			return nil, fmt.Errorf("logical volume %s has a %s segment; only linear ones can be mapped", lv.Name, s.Type)
		}
		start, ok := starts[s.PV]
		if !ok || s.PV == "" {
			return nil, fmt.Errorf("logical volume %s: segment on unknown physical volume %q", lv.Name, s.PV)
		}
		pv, ok := m.pvs[s.PV]
		if !ok {
			pv, err = os.OpenFile(s.PV, os.O_RDWR, 0)
			if err != nil {
				return nil, err
			}
			m.pvs[s.PV] = pv
		}
		exts = append(exts, extent{start: s.Start, size: s.Size, pv: pv, off: start + s.PE*vg.ExtentSize})
	}
	return exts, nil
}

func (m *extentMap) refresh(ctx context.Context, lv *lvm.LV) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refreshLocked(ctx, lv)
}

// refreshLocked is refresh with m.mu held.
func (m *extentMap) refreshLocked(ctx context.Context, lv *lvm.LV) error {
	f, ok := m.vols[lv.Name]
	if !ok {
		return nil
	}
	exts, err := m.extents(ctx, lv)
	if err != nil {
		return err
	}
	f.set(exts, lv.Size)
	if loop, ok := m.loops[lv.Name]; ok {
		if out, err := exec.CommandContext(ctx, "losetup", "--set-capacity", loop).CombinedOutput(); err != nil {
			return fmt.Errorf("losetup --set-capacity %s: %v: %s", loop, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

func (m *extentMap) deactivate(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deactivateLocked(ctx, name)
}

func (m *extentMap) deactivateLocked(ctx context.Context, name string) error {
	if loop, ok := m.loops[name]; ok {
		if err := exclusiveProbe(loop); err != nil {
			return err
		}
		if out, err := exec.CommandContext(ctx, "losetup", "--detach", loop).CombinedOutput(); err != nil {
			return fmt.Errorf("losetup --detach %s: %v: %s", loop, err, strings.TrimSpace(string(out)))
		}
		delete(m.loops, name)
		if err := os.Remove(m.path(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		_ = os.Remove(filepath.Dir(m.path(name))) // only when empty
	}
	if _, ok := m.vols[name]; ok {
		m.root.RmChild(name)
		_ = m.root.NotifyEntry(name)
		delete(m.vols, name)
	}
	return nil
}

// close detaches every loop device (lazily for one still in use, which then fails its I/O), unmounts the
// file system and closes the physical volumes. A file system still in use is detached instead, and close
// returns at once with an error saying so.
func (m *extentMap) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, loop := range m.loops {
		if err := m.deactivateLocked(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("%s still in use at close: %w", loop, err))
			_ = exec.Command("losetup", "--detach", loop).Run()
			_ = os.Remove(m.path(name))
			_ = os.Remove(filepath.Dir(m.path(name)))
		}
	}
	if err := m.srv.Unmount(); err != nil {
		// A volume still in use (a mount on its loop device) keeps the FUSE connection open after a lazy
		// unmount, and its server serving, until the last user lets go, which may be never: close must
		// not wait for it. The connection ends with this process, and the volume's user sees I/O errors.
		errs = append(errs, fmt.Errorf("unmount %s: %w (detached; volumes in use lose their device when the driver exits)", m.dir, err))
		_ = syscall.Unmount(m.dir, syscall.MNT_DETACH)
		return errors.Join(errs...)
	}
	m.srv.Wait()
	for _, pv := range m.pvs {
		_ = pv.Sync()
		_ = pv.Close()
	}
	return errors.Join(errs...)
}

// extent is size bytes at start in a volume, found at off on pv.
type extent struct {
	start, size int64
	pv          *os.File
	off         int64
}

// lvFile is one volume as a file.
type lvFile struct {
	fs.Inode
	mu   sync.RWMutex
	exts []extent
	size int64
}

var (
	_ fs.NodeOpener    = (*lvFile)(nil)
	_ fs.NodeReader    = (*lvFile)(nil)
	_ fs.NodeWriter    = (*lvFile)(nil)
	_ fs.NodeGetattrer = (*lvFile)(nil)
	_ fs.NodeFsyncer   = (*lvFile)(nil)
	_ fs.NodeFlusher   = (*lvFile)(nil)
	_ fs.NodeSetattrer = (*lvFile)(nil)
)

// sizeNow is the size the file shows.
func (f *lvFile) sizeNow() int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.size
}

func (f *lvFile) set(exts []extent, size int64) {
	f.mu.Lock()
	f.exts, f.size = exts, size
	f.mu.Unlock()
}

// io runs op on each piece of [off, off+n) in turn, clipped to the volume, and returns how many bytes were
// done.
func (f *lvFile) io(off int64, n int, op func(pv *os.File, pvOff int64, lo, hi int) (int, error)) (int, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	done := 0
	for done < n {
		pos := off + int64(done)
		if pos >= f.size {
			break
		}
		var e *extent
		for i := range f.exts {
			if pos >= f.exts[i].start && pos < f.exts[i].start+f.exts[i].size {
				e = &f.exts[i]
				break
			}
		}
		if e == nil {
			return done, fmt.Errorf("offset %d is in no extent", pos)
		}
		chunk := min(int64(n-done), e.start+e.size-pos)
		m, err := op(e.pv, e.off+pos-e.start, done, done+int(chunk))
		done += m
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (f *lvFile) Open(context.Context, uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *lvFile) Read(_ context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := f.io(off, len(dest), func(pv *os.File, pvOff int64, lo, hi int) (int, error) {
		return pv.ReadAt(dest[lo:hi], pvOff)
	})
	if err != nil && n == 0 {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *lvFile) Write(_ context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := f.io(off, len(data), func(pv *os.File, pvOff int64, lo, hi int) (int, error) {
		return pv.WriteAt(data[lo:hi], pvOff)
	})
	if err != nil && n == 0 {
		return 0, syscall.EIO
	}
	if n == 0 && len(data) > 0 {
		return 0, syscall.ENOSPC
	}
	return uint32(n), 0
}

func (f *lvFile) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out.Mode = fuse.S_IFREG | 0o600
	out.Size = uint64(f.size)
	out.Blocks = uint64(f.size) / 512
	out.Blksize = 4096
	return 0
}

// Setattr accepts a change of size only to the size the volume has (a volume grows through LVM).
func (f *lvFile) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		f.mu.RLock()
		same := int64(sz) == f.size
		f.mu.RUnlock()
		if !same {
			return syscall.EPERM
		}
	}
	return f.Getattr(ctx, fh, out)
}

func (f *lvFile) Fsync(context.Context, fs.FileHandle, uint32) syscall.Errno { return f.sync() }

func (f *lvFile) Flush(context.Context, fs.FileHandle) syscall.Errno { return 0 }

func (f *lvFile) sync() syscall.Errno {
	f.mu.RLock()
	defer f.mu.RUnlock()
	seen := map[*os.File]bool{}
	for _, e := range f.exts {
		if !seen[e.pv] {
			seen[e.pv] = true
			if err := e.pv.Sync(); err != nil {
				return syscall.EIO
			}
		}
	}
	return 0
}

// zeroEnds zeroes the first and the last n bytes of the volume, so that a volume made on the extents of a
// removed one shows no old filesystem signature.
func (f *lvFile) zeroEnds(n int64) error {
	f.mu.RLock()
	size := f.size
	f.mu.RUnlock()
	n = min(n, size)
	zero := make([]byte, n)
	for _, off := range []int64{0, size - n} {
		if _, err := f.io(off, int(n), func(pv *os.File, pvOff int64, lo, hi int) (int, error) {
			return pv.WriteAt(zero[lo:hi], pvOff)
		}); err != nil {
			return err
		}
	}
	if errno := f.sync(); errno != 0 {
		return errno
	}
	return nil
}
