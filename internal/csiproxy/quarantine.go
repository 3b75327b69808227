package csiproxy

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/safedir"
	"crust.dev/crust/api/volume"
)

// QuarantineDir is the directory, in kubelet's root directory, into which the proxy moves the target of a
// deferred volume that held data at NodeUnpublishVolume: <kubelet>/crust-quarantine/<pod uid>/<volume
// id>-<UTC time>. What it holds is the pod's data, for an operator to look at, kept within the bounds
// pruneQuarantine keeps.
const QuarantineDir = "crust-quarantine"

// releaseTarget readies the target of the deferred volume of rec for removal, so that unpublishing never
// loses or hides what a runtime wrote there: it unmounts the proxy's guard from it (unguardTarget), then,
// when the target holds anything but kubelet's empty subPath directories (targetData), moves the whole
// target directory into the quarantine (quarantineTarget) and says so in a log line, the counter
// crust_csi_proxy_quarantined_targets_total and a VolumeDataQuarantined Event on the pod. It answers
// FailedPrecondition, naming what the target holds and why it stays, when the target holds a mount
// point or cannot be moved; an unreadable target is Internal.
func (p *Proxy) releaseTarget(rec *Record) error {
	target := rec.Path
	if err := unguardTarget(target); err != nil {
		return errdefs.Errorf(errdefs.ErrInternal, "unmount the read-only guard from the target path: %v", err)
	}
	entry, what, err := targetData(target)
	if err != nil || entry == "" {
		return err
	}
	held := heldData(target, entry, what)
	if what == whyMount {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s; not unpublishing: unmount it, then retry", held)
	}
	dest, err := quarantineTarget(target, rec.VolumeID, time.Now())
	if err != nil {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s; moving it into the quarantine failed: %v; not unpublishing: "+
			"move it away, then retry", held, err)
	}
	p.log.Warn("a deferred volume's target held data written on the node's disk: moved it into the quarantine, and unpublishing",
		"target", target, "volume_id", rec.VolumeID, "entry", entry, "what", what, "quarantine", dest)
	p.metrics.TargetQuarantined()
	if err := p.pruneQuarantine(time.Now()); err != nil {
		p.log.Error("keep the quarantine within its bounds", "err", err)
	}
	p.podEvent(p.podOfTarget(target), corev1.EventTypeWarning, ReasonDataQuarantined,
		"volume %s: its target path on the node held %s, %s: the pod's runtime wrote to the node's disk instead of the volume "+
			"(it did not consume crust's descriptor). The target was moved to %s on node %s, so that the pod can terminate; "+
			"nothing of it is on the volume", rec.VolumeID, entry, what, dest, p.cfg.NodeName)
	return nil
}

// quarantineTarget moves the target directory at target, a path of kubelet's shape, by one rename that
// replaces nothing and follows no link, into <kubelet>/crust-quarantine/<pod uid>/ (each made mode 0700
// when missing, and refused when a link or not a directory) under a new name made of volumeID and now
// (quarantineName), and answers the path it now has. The quarantine lies in kubelet's root directory so
// that it is on the target's filesystem as a rule; a target on another (the pods' directory a mount of its
// own: EXDEV) is copied, verified and removed instead (moveAcross). A target not of kubelet's shape cannot
// be moved.
func quarantineTarget(target, volumeID string, now time.Time) (string, error) {
	t, ok := volume.ParseTargetPath(target)
	if !ok {
		return "", fmt.Errorf("%s is not a target path of kubelet's shape (<kubelet>/pods/<uid>/volumes/%s/<name>/mount), "+
			"so no kubelet directory is known to hold the quarantine", target, volume.CSIPluginDir)
	}
	root, err := safedir.Open(t.KubeletDir)
	if err != nil {
		return "", err
	}
	defer func() { _ = root.Close() }()
	q, err := root.EnsureDir(QuarantineDir, 0o700)
	if err != nil {
		return "", err
	}
	defer func() { _ = q.Close() }()
	if err := q.CheckOwned(); err != nil {
		return "", err
	}
	pod, err := q.EnsureDir(t.PodUID, 0o700)
	if err != nil {
		return "", err
	}
	defer func() { _ = pod.Close() }()
	parent, err := safedir.Open(filepath.Dir(target))
	if err != nil {
		return "", err
	}
	defer func() { _ = parent.Close() }()
	name := quarantineName(volumeID, now)
	err = parent.RenameNoReplace(filepath.Base(target), pod, name)
	if errors.Is(err, unix.EXDEV) {
		err = moveAcross(parent, filepath.Base(target), pod, name)
	}
	if err != nil {
		return "", err
	}
	if err := pod.Sync(); err != nil {
		return "", err
	}
	return pod.Join(name), parent.Sync()
}

// quarantineName names a target quarantined at now: volumeID, each byte but letters, digits, '.', '_'
// and '-' replaced by '_' and cut to 200 bytes (a volume id may hold '/' and be long), then '-' and now in
// UTC to the nanosecond, such as vol-1-20261206T151412.123456789Z.
func quarantineName(volumeID string, now time.Time) string {
	const kept = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
	safe := []byte(volumeID)
	for i, c := range safe {
		if strings.IndexByte(kept, c) < 0 {
			safe[i] = '_'
		}
	}
	return string(safe[:min(len(safe), 200)]) + "-" + now.UTC().Format("20060102T150405.000000000Z")
}

// podOfTarget is the pod whose kubelet directory holds target, as the pod cache holds it (by the UID in
// the target path): the pod an Event about the target goes to. It is the zero Pod, to which no Event
// goes, without pod look-ups, for a target not of kubelet's shape, or for a pod the cache does not hold.
func (p *Proxy) podOfTarget(target string) client.Pod {
	t, ok := volume.ParseTargetPath(target)
	if !ok || p.pods == nil {
		return client.Pod{}
	}
	pod, ok := p.pods.PodByUID(t.PodUID)
	if !ok {
		return client.Pod{}
	}
	return podRef(pod)
}

// podRef names pod as podEvent takes it.
func podRef(pod Pod) client.Pod {
	return client.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
}

// moveAcross moves the entry name of from, a directory, to the new name to of dir, on another filesystem:
// it copies the tree (copyTree), makes the copy durable, then removes the original; a failure before the
// removal removes the copy and leaves the original as it was.
func moveAcross(from *safedir.Dir, name string, dir *safedir.Dir, to string) error {
	src, err := from.OpenDir(name)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	dst, err := dir.MkdirOpen(to, 0o700)
	if err != nil {
		return err
	}
	defer func() { _ = dst.Close() }()
	if err := copyTree(src, dst); err != nil {
		return errors.Join(fmt.Errorf("copy into the quarantine (across filesystems): %w", err), dir.RemoveAll(to))
	}
	if err := dir.Sync(); err != nil {
		return errors.Join(err, dir.RemoveAll(to))
	}
	return from.RemoveAll(name)
}

// copyTree copies what src holds into dst, an empty directory: directories, regular files (bytes and
// permission bits, each read back and compared by SHA-256 once durable) and symbolic links (as links,
// never followed). Anything else (a device, a FIFO, a socket) is an error naming it. Nothing is opened
// through a link.
func copyTree(src, dst *safedir.Dir) error {
	names, err := src.Names()
	if err != nil {
		return err
	}
	for _, n := range names {
		fi, err := src.Lstat(n)
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			err = copyDir(src, dst, n, fi.Mode().Perm())
		case fi.Mode().IsRegular():
			err = copyFile(src, dst, n, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			var to string
			if to, err = src.Readlink(n); err == nil {
				err = dst.Symlink(to, n)
			}
		default:
			err = fmt.Errorf("%s is a %s, which cannot be copied", src.Join(n), safedir.Kind(fi.Mode()))
		}
		if err != nil {
			return err
		}
	}
	return dst.Sync()
}

// copyDir copies the directory name of src into dst (copyTree), with the permission bits perm and the
// owner's access kept.
func copyDir(src, dst *safedir.Dir, name string, perm fs.FileMode) error {
	s, err := src.OpenDir(name)
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	d, err := dst.MkdirOpen(name, perm|0o700)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return copyTree(s, d)
}

// copyFile copies the regular file name of src into a new file of dst with mode perm, makes it durable,
// and reads it back to compare it with what was read.
func copyFile(src, dst *safedir.Dir, name string, perm fs.FileMode) error {
	in, err := src.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := dst.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }()
	read := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, read), in); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return err
	}
	written := sha256.New()
	if _, err := io.Copy(written, out); err != nil {
		return err
	}
	if !bytes.Equal(read.Sum(nil), written.Sum(nil)) {
		return fmt.Errorf("%s: the copy reads back other bytes", dst.Join(name))
	}
	return nil
}
