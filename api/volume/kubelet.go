package volume

import (
	"path/filepath"
	"strings"
)

// CSIPluginDir is the directory, in a pod's volumes directory, under which kubelet keeps one directory per
// CSI volume of the pod.
const CSIPluginDir = "kubernetes.io~csi"

// TargetPath is what a CSI publish target path of kubelet's shape says: kubelet publishes a filesystem
// volume at <kubelet root>/pods/<pod uid>/volumes/kubernetes.io~csi/<volume name>/mount.
type TargetPath struct {
	// KubeletDir is the kubelet root the path lies under, such as /var/lib/kubelet.
	KubeletDir string
	// PodUID is the pod's UID: the name of its directory under <kubelet root>/pods.
	PodUID string
	// VolumeName is the volume's name in the pod (for a PersistentVolume, the PV's name).
	VolumeName string
}

// ParseTargetPath parses a publish target path of kubelet's shape (see TargetPath). ok is false for a
// path of any other shape (not absolute, not clean, another layout), which is not an error: CSI lets a
// CO choose any target path.
func ParseTargetPath(target string) (t TargetPath, ok bool) {
	if !filepath.IsAbs(target) || filepath.Clean(target) != target {
		return TargetPath{}, false
	}
	volDir, mount := filepath.Split(target)
	pluginDir, name := filepath.Split(filepath.Clean(volDir))
	volumesDir, plugin := filepath.Split(filepath.Clean(pluginDir))
	podDir, volumes := filepath.Split(filepath.Clean(volumesDir))
	podsDir, uid := filepath.Split(filepath.Clean(podDir))
	root, pods := filepath.Split(filepath.Clean(podsDir))
	if mount != "mount" || plugin != CSIPluginDir || volumes != "volumes" || pods != "pods" ||
		name == "" || uid == "" || root == "" {
		return TargetPath{}, false
	}
	return TargetPath{KubeletDir: filepath.Clean(root), PodUID: uid, VolumeName: name}, true
}

// PodDirUID returns the UID of the pod whose kubelet directory, <kubeletDir>/pods/<uid>, holds path (or
// is path), or "" when path lies in no pod directory of kubeletDir. Both paths are taken as given: no
// symlink is resolved.
func PodDirUID(kubeletDir, path string) string {
	rel, err := filepath.Rel(filepath.Join(kubeletDir, "pods"), path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return ""
	}
	uid, _, _ := strings.Cut(rel, "/")
	return uid
}
