package csiproxy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
)

// A deferred volume's target is an empty directory on the node's disk that a runtime claiming the volume
// from crustd never looks in. A runtime that does not claim it (one that ignores crust, or looks for
// Kata's descriptors elsewhere) bind-mounts or shares the target as it is, and the container's writes
// land on the node's root filesystem. The guard is an empty read-only tmpfs the proxy mounts on the
// target once the volume is deposited: such a container sees a read-only filesystem, and its writes fail
// with EROFS instead of filling the node's disk.
//
// kubelet makes a subPath's directory in the target on the node (<target>/<subPath>) before the
// container starts, which a read-only target refuses: so a pod that mounts any volume with a subPath or
// subPathExpr gets no guard, nor does a pod the cache does not hold (nothing says it has no subPath).

// guardSource is the source of the guard's mount, by which the mount table tells the proxy's guard from
// any other mount.
const guardSource = "crust-deferred"

// guardPod reports whether a deferred volume of pod gets the guard: the proxy guards targets
// (Config.GuardTargets), and its cache holds the pod, under pod's UID when that is known, with no
// subPath.
func (p *Proxy) guardPod(pod client.Pod) bool {
	if !p.cfg.GuardTargets || p.pods == nil || pod.Namespace == "" || pod.Name == "" {
		return false
	}
	cached, ok := p.pods.Pod(pod.Namespace, pod.Name)
	return ok && (pod.UID == "" || pod.UID == cached.UID) && !cached.SubPath
}

// guard mounts the guard on a deferred volume's target when its pod gets one (guardPod); see guardTarget.
func (p *Proxy) guard(pod client.Pod, target string) error {
	if !p.guardPod(pod) {
		return nil
	}
	if err := guardTarget(target); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "mount the read-only guard on the target path %s: %v", target, err)
	}
	return nil
}

// guardTarget mounts the guard (tmpfs, ro, nosuid, nodev, noexec, 4 KiB, its root mode 0555) on the
// directory at target, reached without following a link, unless target is a mount point already: a
// guard of an earlier try, or anything else, which it leaves as it is.
func guardTarget(target string) error {
	fd, err := openPath(target)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	if m, err := topMount(fd); err != nil || m != nil {
		return err
	}
	// The descriptor's magic link names the directory opened, so the mount lands there and nowhere else.
	err = unix.Mount(guardSource, "/proc/self/fd/"+strconv.Itoa(fd), "tmpfs",
		unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
	if err != nil {
		return &os.PathError{Op: "mount tmpfs", Path: target, Err: err}
	}
	return nil
}

// unguardTarget unmounts (detaches) the guard from the directory at target for as long as the topmost
// mount there is the guard; anything else mounted there is left. A missing target is nothing to do.
func unguardTarget(target string) error {
	for {
		on, err := guarded(target)
		if err != nil || !on {
			return err
		}
		// Detached lazily: the guard is empty and read-only, so a process that still has it open (a
		// container of a runtime that bound it, going away) loses nothing, and the target is free at once.
		if err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); err != nil {
			return &os.PathError{Op: "unmount", Path: target, Err: err}
		}
	}
}

// guarded reports whether the topmost mount on the directory at target is the guard (false for a
// missing target).
func guarded(target string) (bool, error) {
	fd, err := openPath(target)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() { _ = unix.Close(fd) }()
	m, err := topMount(fd)
	return m != nil && m.FSType == "tmpfs" && m.Source == guardSource, err
}

// openPath opens the directory at path as a location only (O_PATH), never through a link.
func openPath(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// topMount answers the mount table's entry of the mount whose root the open directory fd is (the
// topmost, when several are stacked there), or nil when fd is no mount's root: when it lies in the same
// mount as its parent. Mounts are told apart by their ids, not by paths, which a link may spell otherwise.
func topMount(fd int) (*mountinfo.Info, error) {
	id, err := mountID(fd)
	if err != nil {
		return nil, err
	}
	parent, err := unix.Openat(fd, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the parent directory: %w", err)
	}
	parentID, err := mountID(parent)
	_ = unix.Close(parent)
	if err != nil || id == parentID {
		return nil, err
	}
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.ID != id, m.ID == id })
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("mount %d is not in the mount table", id)
	}
	return ms[0], nil
}

// mountID is the id of the mount the open file fd lies in, as /proc/self/fdinfo says it (mnt_id, the id
// the mount table gives).
func mountID(fd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("mnt_id:")); ok {
			return strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	return 0, errors.New("fdinfo gives no mnt_id")
}
