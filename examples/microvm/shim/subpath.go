package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vmhandler"
)

// A container's subPath of a volume reaches its spec as a bind source kubelet made: kubelet creates the
// directory <target>/<subPath> in the volume's target path on the node, then bind-mounts it at
// <kubelet>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>. For a crust volume the target is an
// empty directory on the node's disk, so that bind mount is a directory of the node's disk too: it must
// never be shared with the guest. The shim finds the target it lies in and the path within it from the
// mount table, and binds that path of the guest's mount of the volume instead.

// subPathPod answers the pod uid when p has the shape of kubelet's subPath bind mount,
// <kubelet>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>.
func (s Settings) subPathPod(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, filepath.Join(s.KubeletDir, "pods")+"/")
	if !ok {
		return "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "volume-subpaths" || slices.Contains(parts, "") {
		return "", false
	}
	return parts[0], true
}

// csiTargets are the target paths kubelet gives pod uid's CSI volumes of a filesystem,
// <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount, those there now.
func (s Settings) csiTargets(uid string) ([]string, error) {
	dir := filepath.Join(s.KubeletDir, "pods", uid, "volumes", "kubernetes.io~csi")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var targets []string
	for _, e := range entries {
		if e.IsDir() {
			targets = append(targets, filepath.Join(dir, e.Name(), "mount"))
		}
	}
	return targets, nil
}

// inTarget is where a subPath bind mount lies: in the directory at target, at rel (relative and clean,
// "." for the target itself).
type inTarget struct{ target, rel string }

// subPathIn answers which of targets the bind mount at src lies in, and at which path, from mounts (the
// mount table, as /proc/self/mountinfo lists it). src's own mount gives its root (the path of what it
// shows within its filesystem) and its device. A target lies in the mount whose mount point is the
// longest prefix of it (or on which it is mounted itself), so its path within its filesystem is that
// mount's root joined with the rest of the target's path; src lies in the target when the device is the
// same and that path is a prefix of src's root. Paths are compared with their links resolved, as the
// mount table lists them; a target that cannot be resolved (gone) is left out. A src that is no mount
// point is FailedPrecondition: nothing says which volume it shows.
func subPathIn(mounts []*mountinfo.Info, src string, targets []string) ([]inTarget, error) {
	resolved, err := filepath.EvalSymlinks(src)
	if err != nil {
		return nil, fmt.Errorf("subPath mount %s: %w", src, err)
	}
	sub := mountHolding(mounts, resolved)
	if sub == nil || sub.Mountpoint != resolved {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "subPath %s is not a mount point: kubelet bind-mounts "+
			"a subPath there, and without its mount nothing says which volume it is of", src)
	}
	var in []inTarget
	for _, t := range targets {
		rt, err := filepath.EvalSymlinks(t)
		if err != nil {
			continue
		}
		m := mountHolding(mounts, rt)
		if m == nil || m.Major != sub.Major || m.Minor != sub.Minor {
			continue
		}
		rest, _ := filepath.Rel(m.Mountpoint, rt) // m.Mountpoint is rt or a prefix of it
		root := filepath.Join(m.Root, rest)
		rel, err := filepath.Rel(root, sub.Root)
		if err != nil || !filepath.IsLocal(rel) { // "." is local: the target itself
			continue
		}
		in = append(in, inTarget{target: t, rel: rel})
	}
	return in, nil
}

// mountHolding is the mount of mounts that p lies in: the one whose mount point is the longest prefix of
// p, the last listed (the topmost) of those on that mount point; nil when none is.
func mountHolding(mounts []*mountinfo.Info, p string) *mountinfo.Info {
	var best *mountinfo.Info
	for _, m := range mounts {
		mp := m.Mountpoint
		if mp != p && mp != "/" && !strings.HasPrefix(p, mp+"/") {
			continue
		}
		if best == nil || len(mp) >= len(best.Mountpoint) {
			best = m
		}
	}
	return best
}

// attachVolume attaches the crust volume that the bind source src, a path in a pod's directory, stands
// for, and answers it with the guest path the container's bind comes from: for a target crustd holds a
// descriptor for, the volume's guest mount; for kubelet's subPath mount of a directory in such a target
// (subPathIn), that directory of the guest's mount, made when missing (makeGuestDir). A source of no crust
// volume is vmhandler.ErrNotDeferred: an ordinary mount, to share. A subPath of a crust volume is never
// answered so.
func (s *sandbox) attachVolume(ctx context.Context, src string) (vmhandler.Attached, error) {
	uid, ok := s.set.subPathPod(src)
	if !ok {
		return s.volumes.Attach(ctx, src)
	}
	targets, err := s.set.csiTargets(uid)
	if err != nil {
		return vmhandler.Attached{}, fmt.Errorf("the volumes of pod %s: %w", uid, err)
	}
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return vmhandler.Attached{}, fmt.Errorf("subPath %s: the mount table: %w", src, err)
	}
	ins, err := subPathIn(mounts, src, targets)
	if err != nil {
		return vmhandler.Attached{}, err
	}
	for _, in := range ins {
		att, err := s.volumes.Attach(ctx, in.target)
		switch {
		case vmhandler.ErrNotDeferred(err):
			continue
		case err != nil:
			return vmhandler.Attached{}, fmt.Errorf("subPath %s of volume %s: %w", in.rel, in.target, err)
		case att.Block:
			return vmhandler.Attached{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "subPath %s of %s: the volume is raw block", in.rel, in.target)
		}
		if err := makeGuestDir(ctx, s.vm.Agent(), att.GuestPath, in.rel); err != nil {
			return vmhandler.Attached{}, fmt.Errorf("subPath %s of volume %s: %w", in.rel, in.target, err)
		}
		s.log.Info("subPath of a crust volume: bound from the guest's mount of the volume, not from the node",
			"subpath_mount", src, "target", in.target, "path", in.rel)
		att.GuestPath = path.Join(att.GuestPath, in.rel)
		return att, nil
	}
	return vmhandler.Attached{}, errdefs.Errorf(errdefs.ErrNotFound, "subPath %s lies in no crust volume of pod %s", src, uid)
}

// makeGuestDirScript makes $2 (a clean relative path) in the directory $1, one element at a time, as
// kubelet's SafeMakeDir makes a subPath in a volume on the node: each missing element made by root with
// the permissions of the volume's root directory (an fsGroup's setgid bit included), never through a link.
// The last element may be a regular file already there: a subPath may name a file, which the container
// then gets bound in its place.
const makeGuestDirScript = `set -ef
root=$1; d=$1; mode=$(stat -c %a "$1"); IFS=/
for c in $2; do
	d=$d/$c
	if [ -L "$d" ]; then echo "$d is a symbolic link" >&2; exit 1; fi
	if [ ! -e "$d" ]; then mkdir "$d" && chmod "$mode" "$d"; fi
	if [ "$d" = "$root/$2" ] && [ -f "$d" ]; then exit 0; fi
	if [ ! -d "$d" ]; then echo "$d is not a directory" >&2; exit 1; fi
done`

// makeGuestDir makes the directory rel (relative and clean) in the guest directory root, a volume's
// mount, when it is missing, each element it makes with root's permissions, owned by root (as kubelet
// makes a subPath's directory on the node); rel may instead name a regular file there. An element that is
// a symbolic link, or not a directory (but rel's own regular file), is an error: what is in the volume is
// the pod's, and a link there must not lead a container's bind out of it. A link planted between this
// check and the guest's bind mount is not caught.
func makeGuestDir(ctx context.Context, agent agentv1.AgentServiceService, root, rel string) error {
	return guestExec(ctx, agent, "making the subPath's directory in the guest", "sh", "-c", makeGuestDirScript, "sh", root, rel)
}

// guestExec runs argv in the guest, for what (which the error names); an exit status other than 0 is an
// error with the command's stderr.
func guestExec(ctx context.Context, agent agentv1.AgentServiceService, what string, argv ...string) error {
	r, err := agent.Exec(ctx, &agentv1.ExecRequest{Argv: argv})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if r.GetExitStatus() != 0 {
		return fmt.Errorf("%s: exit %d: %s", what, r.GetExitStatus(), strings.TrimSpace(string(r.GetStderr())))
	}
	return nil
}
