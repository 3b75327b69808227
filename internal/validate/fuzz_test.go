package validate

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// FuzzSpec throws arbitrary target paths, mount flags (split on ';'), a metadata pair and a supplemental
// group at Spec. Whatever it gets, Spec must not panic, must refuse with a *FieldError, and what it
// accepts must satisfy the invariants the rest of crustd relies on.
func FuzzSpec(f *testing.F) {
	e := newEnv(f)
	rel := func(p string) string { return strings.TrimPrefix(p, e.root+"/") }
	// target, rooted (target is taken relative to the kubelet root), flags, readOnly, key, value, group, hasGroup
	f.Add(rel(e.target), true, "noatime;discard", false, "csi.storage.k8s.io/pod.name", "web-0", int64(1000), true)
	f.Add(rel(e.csi)+"/link/mount", true, "ro", true, "encryptionKey", "s3cr3t", int64(0), false)
	f.Add("../kubelet/pods/x", true, "bind", false, "fsGroup", "1", int64(-1), true)
	f.Add("pods//x/", true, "noatime,bind", false, "", "", int64(math.MaxInt32)+1, true)
	f.Add("/etc/passwd", false, "ro;ro", true, "foo", "bar", int64(5), false)
	f.Add(e.realRoot+"/pods/x", false, "make-shared;rw", true, "example.com/k1", "v", int64(7), true)
	f.Add(rel(e.root)+"/pods/"+uid1+"/afile/x", true, "", false, "csi.storage.k8s.io/pod.uid", uid2, int64(0), false)
	f.Add("pods/a\x00b", true, "a\x00b;\n", false, "\xff", "\xff", int64(1), true)

	f.Fuzz(func(t *testing.T, target string, rooted bool, flags string, readOnly bool, key, value string,
		group int64, hasGroup bool) {
		if rooted {
			target = e.root + "/" + target
		}
		s := &crustv1.VolumeSpec{VolumeTargetPath: target, VolumeBackingPath: e.link, FsType: "xfs", ReadOnly: readOnly}
		if flags != "" {
			s.MountFlags = strings.Split(flags, ";")
		}
		if key != "" || value != "" {
			s.Metadata = map[string]string{key: value}
		}
		if hasGroup {
			s.VolumeSupplementalGroup = &group
		}

		c, err := e.vFile.Spec(s)
		if err != nil {
			var fe *errdefs.FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Reason == "" || c != nil {
				t.Fatalf("refusal %v (Checked %v) is not a complete *FieldError alone", err, c)
			}
			return
		}
		checkInvariants(t, e, c)
	})
}

// checkInvariants asserts what an accepted spec promises, independently of how Spec checks it.
func checkInvariants(t *testing.T, e *env, c *Checked) {
	t.Helper()
	s := c.Spec
	p := s.GetVolumeTargetPath()
	switch {
	case len(p) > maxPathLen || !utf8.ValidString(p) || strings.ContainsAny(p, "\x00\n\r"):
		t.Fatalf("accepted target %q: bad string", p)
	case !filepath.IsAbs(p) || filepath.Clean(p) != p:
		t.Fatalf("accepted target %q: not absolute and clean", p)
	case !strings.HasPrefix(p, e.root+"/") || p == e.root+"/":
		t.Fatalf("accepted target %q: not strictly under %s", p, e.root)
	}
	onDisk := e.realRoot
	for _, comp := range strings.Split(strings.TrimPrefix(p, e.root+"/"), "/") {
		if comp == "." || comp == ".." || comp == "" {
			t.Fatalf("accepted target %q: component %q", p, comp)
		}
		onDisk += "/" + comp
		fi, err := os.Lstat(onDisk)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			t.Fatalf("accepted target %q: %s is a symlink", p, onDisk)
		}
	}

	if n := len(s.GetMountFlags()); n > maxMountFlags {
		t.Fatalf("accepted %d mount flags", n)
	}
	seen := map[string]bool{}
	for _, fl := range s.GetMountFlags() {
		name, _, _ := strings.Cut(strings.ToLower(fl), "=")
		switch {
		case fl == "" || len(fl) > maxMountFlagLen || seen[fl]:
			t.Fatalf("accepted mount flag %q (empty, long or repeated)", fl)
		case strings.ContainsAny(fl, ", \t\n\x00"):
			t.Fatalf("accepted mount flag %q with a separator", fl)
		case bindLike[name] || strings.HasPrefix(name, "make-"):
			t.Fatalf("accepted bind-like mount flag %q", fl)
		case fl == "ro" && !s.GetReadOnly(), fl == "rw" && s.GetReadOnly():
			t.Fatalf("accepted %q with read_only=%v", fl, s.GetReadOnly())
		}
		seen[fl] = true
	}

	if n := len(s.GetMetadata()); n > maxMetadataPairs {
		t.Fatalf("accepted %d metadata pairs", n)
	}
	for k, val := range s.GetMetadata() {
		if !e.vFile.metaKeys[k] || volume.TypedField(k) != "" || len(val) > maxMetadataValueLen {
			t.Fatalf("accepted metadata %q=%q", k, val)
		}
	}

	if g := s.VolumeSupplementalGroup; g != nil && (*g < 0 || *g > math.MaxInt32) {
		t.Fatalf("accepted group %d", *g)
	}
	hasPolicy := s.GetSupplementalGroupChangePolicy() != crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_UNSPECIFIED
	if hasPolicy != (s.VolumeSupplementalGroup != nil) {
		t.Fatalf("accepted policy %v with group %v", s.GetSupplementalGroupChangePolicy(), s.VolumeSupplementalGroup)
	}
	if s.GetVolumeType() == crustv1.VolumeType_VOLUME_TYPE_UNSPECIFIED {
		t.Fatalf("volume type not normalised")
	}
	if ok, _ := filepath.Match(e.dev+"/*", c.ResolvedBackingPath); !ok || c.DeviceNumber == nil {
		t.Fatalf("accepted device %q (%v)", c.ResolvedBackingPath, c.DeviceNumber)
	}
}
