package shim

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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
