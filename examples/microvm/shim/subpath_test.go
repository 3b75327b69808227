package shim

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"

	"crust.dev/crust/api/errdefs"
)

// TestSubPathIn: kubelet's subPath bind mount is found in the pod's target it shows a directory of, at
// the path within it, from the mount table: with the kubelet directory on the root filesystem or on its
// own, for a target mounted itself (an ordinary volume); not in a target of another device or one it does
// not lie in; and a subPath that is no mount point is FAILED_PRECONDITION.
func TestSubPathIn(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	set := Settings{KubeletDir: filepath.Join(tmp, "kubelet")}
	const uid = "0e0e0e0e-0000-4000-8000-0000000000a1"
	pod := filepath.Join(set.KubeletDir, "pods", uid)
	a := filepath.Join(pod, "volumes", "kubernetes.io~csi", "pv-a", "mount")
	b := filepath.Join(pod, "volumes", "kubernetes.io~csi", "pv-b", "mount")
	src := filepath.Join(pod, "volume-subpaths", "data", "c", "0")
	for _, d := range []string{a, b, src} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := set.subPathPod(src); !ok || got != uid {
		t.Fatalf("subPathPod(%s) = %q, %t; want the pod's uid", src, got, ok)
	}
	for _, p := range []string{a, filepath.Join(pod, "volume-subpaths", "data", "c"), filepath.Join(pod, "volume-subpaths", "data", "c", "0", "x")} {
		if _, ok := set.subPathPod(p); ok {
			t.Errorf("subPathPod(%s): taken for kubelet's subPath mount", p)
		}
	}
	targets, err := set.csiTargets(uid)
	if err != nil || !slices.Equal(targets, []string{a, b}) {
		t.Fatalf("csiTargets: %v, %v; want %v", targets, err, []string{a, b})
	}

	rootfs := &mountinfo.Info{Mountpoint: "/", Root: "/", Major: 8, Minor: 1}
	kubeletFS := &mountinfo.Info{Mountpoint: set.KubeletDir, Root: "/", Major: 8, Minor: 2}
	rel := func(p string) string { r, _ := filepath.Rel(set.KubeletDir, p); return "/" + r }
	for _, c := range []struct {
		name   string
		mounts []*mountinfo.Info
		want   []inTarget
	}{
		{"on the root filesystem", []*mountinfo.Info{rootfs, {Mountpoint: src, Root: filepath.Join(a, "sub", "deeper"), Major: 8, Minor: 1}},
			[]inTarget{{a, "sub/deeper"}}},
		{"the kubelet directory its own filesystem", []*mountinfo.Info{rootfs, kubeletFS, {Mountpoint: src, Root: rel(b) + "/provisioning-5241", Major: 8, Minor: 2}},
			[]inTarget{{b, "provisioning-5241"}}},
		{"the target itself", []*mountinfo.Info{rootfs, {Mountpoint: src, Root: a, Major: 8, Minor: 1}}, []inTarget{{a, "."}}},
		{"a target mounted itself", []*mountinfo.Info{rootfs, {Mountpoint: b, Root: "/", Major: 8, Minor: 3}, {Mountpoint: src, Root: "/x", Major: 8, Minor: 3}},
			[]inTarget{{b, "x"}}},
		{"another device", []*mountinfo.Info{rootfs, kubeletFS, {Mountpoint: src, Root: filepath.Join(a, "sub"), Major: 8, Minor: 1}}, nil},
		{"in no target (an emptyDir's)", []*mountinfo.Info{rootfs, {Mountpoint: src, Root: filepath.Join(pod, "volumes", "kubernetes.io~empty-dir", "e", "s"), Major: 8, Minor: 1}}, nil},
		{"beside a target", []*mountinfo.Info{rootfs, {Mountpoint: src, Root: a + "x/sub", Major: 8, Minor: 1}}, nil},
	} {
		got, err := subPathIn(c.mounts, src, targets)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := subPathIn([]*mountinfo.Info{rootfs}, src, targets); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a subPath that is no mount point: %v, want FAILED_PRECONDITION", err)
	}
}

// makeGuestDirScript, run here by the host's sh as the guest's busybox sh runs it: missing elements are
// made with the root's mode, a regular file may end the path, and a link or a file on the way is refused.
func TestMakeGuestDirScript(t *testing.T) {
	root := t.TempDir()
	if err := os.Chmod(root, 0o775|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"file", "d/file"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rel, fails string
	}{
		{rel: "a/b/c"},
		{rel: "file"},
		{rel: "d/file"},
		{rel: "file/x", fails: "is not a directory"},
		{rel: "link", fails: "is a symbolic link"},
		{rel: "link/x", fails: "is a symbolic link"},
	} {
		out, err := exec.Command("sh", "-c", makeGuestDirScript, "sh", root, tc.rel).CombinedOutput()
		switch {
		case tc.fails == "" && err != nil:
			t.Errorf("%s: %v: %s", tc.rel, err, out)
		case tc.fails != "" && (err == nil || !strings.Contains(string(out), tc.fails)):
			t.Errorf("%s: %v: %q, want a refusal saying %q", tc.rel, err, out, tc.fails)
		}
	}
	fi, err := os.Stat(filepath.Join(root, "a", "b", "c"))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o775 || fi.Mode()&os.ModeSetgid == 0 {
		t.Errorf("a/b/c made as %v (%v), want a directory with the root's mode, setgid included", fi.Mode(), err)
	}
	if _, err := os.Lstat("/etc/x"); err == nil {
		t.Error("a directory was made through the link")
	}
}
