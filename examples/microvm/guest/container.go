//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// containersDir holds a directory per container, <id>/root being the container's root.
const containersDir = "/run/crust/containers"

// maxContainerID bounds a container id (containerd's are at most 76 characters).
const maxContainerID = 128

// container is a prepared root and the processes started in it.
type container struct {
	id     string
	dir    string   // containersDir/<id>
	root   string   // dir/root
	mounts []string // what was mounted, in order (the root first)

	mu       sync.Mutex
	procs    map[string]*process // by exec id; "" is the first process
	removing bool                // RemoveContainer began: no process may start
}

// containers is the agent's table of containers.
type containers struct {
	procs *procTable
	mu    sync.Mutex
	byID  map[string]*container // nil value: being created
}

func newContainers(procs *procTable) *containers {
	return &containers{procs: procs, byID: make(map[string]*container)}
}

// get returns the container id names, NOT_FOUND if there is none.
func (cs *containers) get(id string) (*container, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.byID[id]; c != nil {
		return c, nil
	}
	return nil, agentproto.Errorf(errdefs.ErrNotFound, "container_id: no container %q", id)
}

func checkContainerID(id string) error {
	if id == "" || len(id) > maxContainerID || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "container_id %q: not 1 to %d characters without '/'", id, maxContainerID)
	}
	return nil
}

// checkInside checks that p, the field named field, is an absolute clean path below "/".
func checkInside(field, p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "%s %q: not a clean absolute path below /", field, p)
	}
	return nil
}

// containerMountTypes are the types CreateContainer mounts ("" with bind in the options is a bind).
var containerMountTypes = map[string]bool{"bind": true, "proc": true, "sysfs": true, "tmpfs": true, "devpts": true,
	"mqueue": true, "cgroup": true, "cgroup2": true}

func checkCreate(r *agentv1.CreateContainerRequest) error {
	if err := checkContainerID(r.GetContainerId()); err != nil {
		return err
	}
	if err := checkInside("root", r.GetRoot()); err != nil {
		return err
	}
	for i, m := range r.GetMounts() {
		if err := checkInside(fmt.Sprintf("mounts[%d].destination", i), m.GetDestination()); err != nil {
			return err
		}
		o := parseMountOptions(m.GetType(), m.GetOptions())
		if !containerMountTypes[m.GetType()] && (m.GetType() != "" || !o.bind) {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "mounts[%d].type %q: not one of bind, proc, sysfs, tmpfs, devpts, mqueue, cgroup", i, m.GetType())
		}
		if o.bind && !filepath.IsAbs(m.GetSource()) {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "mounts[%d].source %q: a bind mount's source must be an absolute guest path", i, m.GetSource())
		}
	}
	for i, d := range r.GetDevices() {
		if err := checkInside(fmt.Sprintf("devices[%d].path", i), d.GetPath()); err != nil {
			return err
		}
		if !filepath.IsAbs(d.GetSource()) {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "devices[%d].source %q: not an absolute guest path", i, d.GetSource())
		}
	}
	return nil
}

// create prepares the container's root; on failure it leaves nothing mounted and no entry.
func (cs *containers) create(r *agentv1.CreateContainerRequest) error {
	if err := checkCreate(r); err != nil {
		return err
	}
	id := r.GetContainerId()
	cs.mu.Lock()
	if _, ok := cs.byID[id]; ok {
		cs.mu.Unlock()
		return agentproto.Errorf(errdefs.ErrAlreadyExists, "container_id: container %q exists", id)
	}
	cs.byID[id] = nil
	cs.mu.Unlock()

	dir := filepath.Join(containersDir, id)
	c := &container{id: id, dir: dir, root: filepath.Join(dir, "root"), procs: make(map[string]*process)}
	err := c.prepare(r)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if err != nil {
		c.unmount()
		delete(cs.byID, id)
		return err
	}
	cs.byID[id] = c
	logger.Printf("container %s: root %s on %s, %d mounts", id, r.GetRoot(), c.root, len(c.mounts)-1)
	return nil
}

func (c *container) prepare(r *agentv1.CreateContainerRequest) error {
	if fi, err := os.Stat(r.GetRoot()); err != nil || !fi.IsDir() {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "root %q: not a directory in the guest (%v)", r.GetRoot(), err)
	}
	if err := os.MkdirAll(c.root, 0o755); err != nil {
		return err
	}
	if err := c.mount(r.GetRoot(), c.root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	for i, m := range r.GetMounts() {
		if err := c.mountOne(m); err != nil {
			return fmt.Errorf("mounts[%d] (%s on %s): %w", i, m.GetType(), m.GetDestination(), err)
		}
	}
	for i, d := range r.GetDevices() {
		if err := c.makeDevice(d); err != nil {
			return fmt.Errorf("devices[%d] (%s): %w", i, d.GetPath(), err)
		}
	}
	if h := r.GetHostname(); h != "" {
		// The VM is the pod: its one UTS namespace is the pod's.
		if err := unix.Sethostname([]byte(h)); err != nil {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "hostname %q: %v", h, err)
		}
	}
	if r.GetReadOnlyRoot() {
		if err := unix.Mount("", c.root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read_only_root: remounting %s read-only: %w", c.root, err)
		}
	}
	return nil
}

// mount mounts and records the mount for unmount.
func (c *container) mount(src, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", src, target, err)
	}
	c.mounts = append(c.mounts, target)
	return nil
}

// resolve is p (absolute in the container) as a guest path, its symlinks resolved inside the root.
func (c *container) resolve(p string) (string, error) {
	return securejoin.SecureJoin(c.root, p)
}

// mountPoint makes the mount point at dest, a file when asFile, else a directory.
func mountPoint(dest string, asFile bool) error {
	if !asFile {
		return os.MkdirAll(dest, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dest, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func (c *container) mountOne(m *agentv1.ContainerMount) error {
	o := parseMountOptions(m.GetType(), m.GetOptions())
	if m.GetType() == "cgroup" || m.GetType() == "cgroup2" {
		logger.Printf("container %s: cgroup mount on %s skipped: the guest gives containers no cgroup", c.id, m.GetDestination())
		return nil
	}
	dest, err := c.resolve(m.GetDestination())
	if err != nil {
		return err
	}
	if o.bind {
		fi, err := os.Stat(m.GetSource())
		if err != nil {
			return agentproto.Errorf(errdefs.ErrInvalidArgument, "source: %v", err)
		}
		if err := mountPoint(dest, !fi.IsDir()); err != nil {
			return err
		}
		flags := uintptr(unix.MS_BIND)
		if o.recursive {
			flags |= unix.MS_REC
		}
		if err := c.mount(m.GetSource(), dest, "", flags, ""); err != nil {
			return err
		}
		// A bind ignores every flag but MS_REC: ro, nosuid and the like take a remount.
		if o.flags != 0 {
			if err := unix.Mount("", dest, "", unix.MS_BIND|unix.MS_REMOUNT|o.flags, ""); err != nil {
				return fmt.Errorf("remounting %s with %v: %w", dest, m.GetOptions(), err)
			}
		}
	} else {
		if err := mountPoint(dest, false); err != nil {
			return err
		}
		src := m.GetSource()
		if src == "" {
			src = m.GetType()
		}
		if err := c.mount(src, dest, m.GetType(), o.flags, strings.Join(o.data, ",")); err != nil {
			return err
		}
	}
	if o.propagation != 0 {
		if err := unix.Mount("", dest, "", o.propagation, ""); err != nil {
			return fmt.Errorf("propagation of %s: %w", dest, err)
		}
	}
	if m.GetType() == "tmpfs" && m.GetDestination() == "/dev" {
		return makeDev(dest)
	}
	return nil
}

// devNodes are the character devices of a container's /dev: name, major, minor.
var devNodes = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}

// makeDev fills a fresh /dev (dir) with the standard nodes and links.
func makeDev(dir string) error {
	for _, n := range devNodes {
		p := filepath.Join(dir, n.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("making %s: %w", p, err)
		}
		if err := unix.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}

// makeDevice makes d's node in the container: the type and major:minor of its source, d's mode and owner.
func (c *container) makeDevice(d *agentv1.ContainerDevice) error {
	var st unix.Stat_t
	if err := unix.Stat(d.GetSource(), &st); err != nil {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "source: %v", err)
	}
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFBLK && kind != unix.S_IFCHR {
		return agentproto.Errorf(errdefs.ErrInvalidArgument, "source %s: not a device node", d.GetSource())
	}
	dest, err := c.resolve(d.GetPath())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	mode := d.GetFileMode() & 0o7777
	if mode == 0 {
		mode = 0o660
	}
	_ = os.Remove(dest)
	if err := unix.Mknod(dest, kind|mode, int(st.Rdev)); err != nil {
		return fmt.Errorf("making %s: %w", dest, err)
	}
	if err := unix.Chmod(dest, mode); err != nil { // mknod's mode is masked by the umask
		return err
	}
	return unix.Chown(dest, int(d.GetUid()), int(d.GetGid()))
}

// unmount unmounts what the container mounted, in reverse order, and removes its directory. A mount that
// is busy is detached.
func (c *container) unmount() {
	for i := len(c.mounts) - 1; i >= 0; i-- {
		p := c.mounts[i]
		if err := unix.Unmount(p, 0); err != nil {
			if err2 := unix.Unmount(p, unix.MNT_DETACH); err2 != nil && !errors.Is(err2, unix.EINVAL) {
				logger.Printf("container %s: unmounting %s: %v; detaching: %v", c.id, p, err, err2)
			}
		}
	}
	c.mounts = nil
	if err := os.RemoveAll(c.dir); err != nil {
		logger.Printf("container %s: removing %s: %v", c.id, c.dir, err)
	}
}

// remove kills the container's processes, waits for them and unmounts. An unknown container is not an error.
func (cs *containers) remove(ctx context.Context, id string) error {
	if err := checkContainerID(id); err != nil {
		return err
	}
	cs.mu.Lock()
	c := cs.byID[id]
	cs.mu.Unlock()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	c.removing = true
	procs := make([]*process, 0, len(c.procs))
	for _, p := range c.procs {
		procs = append(procs, p)
	}
	c.mu.Unlock()
	for _, p := range procs {
		p.killGroup(unix.SIGKILL)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		p.closeIO()
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.byID[id] != c { // removed meanwhile by another call
		return nil
	}
	c.unmount()
	delete(cs.byID, id)
	logger.Printf("container %s removed", id)
	return nil
}
