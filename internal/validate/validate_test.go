package validate

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/testutil"
)

const (
	uid1 = "0b7e1c3a-5d2f-4c89-9a61-3f1e2d4c5b6a" // the pod whose directory exists
	uid2 = "5f0e2d9c-1111-4c89-9a61-000000000002" // a pod whose directory does not exist yet
)

// env is a kubelet root and a device directory in a temp dir:
//
//	kubelet -> data/kubelet                       the configured kubelet root is a symlink
//	data/kubelet/pods/<uid1>/afile                a regular file
//	data/kubelet/pods/<uid1>/volumes/kubernetes.io~csi/pv1/   a directory
//	data/kubelet/pods/<uid1>/volumes/kubernetes.io~csi/link -> <tmp>/elsewhere
//	data/kubelet/pods/<uid1>/volumes/kubernetes.io~csi/dangling -> nothing
//	dev/loop200, dev/loop201: nodes with the numbers of real loop devices 0 and 1 (see realLoops),
//	dev/by-id/disk -> ../loop200, dev/null (char 1:3), dev/image.img (regular), dev/dir/, dev/fifo,
//	dev/dangling -> nothing, dev/escape -> ../outside/blk (real loop device 2's number, not allowed)
//
// The validators allow <tmp>/dev/* and /dev/loop*: a node outside /dev passes only when the kernel's name
// for its number is allowed too.
type env struct {
	tmp, root, realRoot, dev string
	csi                      string // <root>/pods/<uid1>/volumes/kubernetes.io~csi
	target                   string // a good target path; it does not exist yet
	blk, blk2, link, chr     string
	image, dir, fifo         string
	dangling, escape, other  string
	v                        *Validator // file-backed volumes refused, no extra metadata keys
	vFile                    *Validator // file-backed volumes allowed, extra metadata keys
	extraKeys                []string   // vFile's extra metadata keys
	allow                    []string   // the validators' DeviceAllow
	loops                    [3]loopDev // the real devices whose numbers blk, blk2 and other carry
}

func newEnv(t testing.TB) *env {
	t.Helper()
	testutil.RequireRoot(t, "to create device nodes")
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{tmp: tmp, root: tmp + "/kubelet", realRoot: tmp + "/data/kubelet", dev: tmp + "/dev"}
	e.csi = e.root + "/pods/" + uid1 + "/volumes/kubernetes.io~csi"
	e.target = e.csi + "/pv1/mount"
	e.blk, e.blk2, e.link, e.chr = e.dev+"/loop200", e.dev+"/loop201", e.dev+"/by-id/disk", e.dev+"/null"
	e.image, e.dir, e.fifo = e.dev+"/image.img", e.dev+"/dir", e.dev+"/fifo"
	e.dangling, e.escape, e.other = e.dev+"/dangling", e.dev+"/escape", tmp+"/outside/blk"

	realCSI := e.realRoot + "/pods/" + uid1 + "/volumes/kubernetes.io~csi"
	for _, d := range []string{realCSI + "/pv1", tmp + "/elsewhere", e.dev + "/by-id", e.dir, tmp + "/outside"} {
		must(t, os.MkdirAll(d, 0o755))
	}
	must(t, os.Symlink("data/kubelet", e.root))
	must(t, os.Symlink(tmp+"/elsewhere", realCSI+"/link"))
	must(t, os.Symlink("missing", realCSI+"/dangling"))
	must(t, os.WriteFile(e.realRoot+"/pods/"+uid1+"/afile", nil, 0o644))
	loops := realLoops(t)
	e.loops = loops
	must(t, unix.Mknod(e.blk, unix.S_IFBLK|0o600, loops[0].mkdev()))
	must(t, unix.Mknod(e.blk2, unix.S_IFBLK|0o600, loops[1].mkdev()))
	must(t, unix.Mknod(e.other, unix.S_IFBLK|0o600, loops[2].mkdev()))
	must(t, unix.Mknod(e.chr, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	must(t, unix.Mkfifo(e.fifo, 0o600))
	must(t, os.WriteFile(e.image, make([]byte, 4096), 0o600))
	must(t, os.Symlink("../loop200", e.link))
	must(t, os.Symlink("missing", e.dangling))
	must(t, os.Symlink("../outside/blk", e.escape))

	e.allow = []string{e.dev + "/*", "/dev/loop*"}
	e.v, err = New(Config{KubeletDir: e.root, DeviceAllow: e.allow})
	must(t, err)
	for i := range 11 {
		e.extraKeys = append(e.extraKeys, fmt.Sprintf("example.com/k%d", i))
	}
	e.extraKeys = append(e.extraKeys, strings.Repeat("k", maxMetadataKeyLen))
	e.vFile, err = New(Config{KubeletDir: e.root, DeviceAllow: e.allow, AllowFileBacked: true,
		MetadataKeys: e.extraKeys})
	must(t, err)
	return e
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// good is a spec every rule accepts.
func (e *env) good() *crustv1.VolumeSpec {
	return &crustv1.VolumeSpec{
		VolumeTargetPath:  e.target,
		VolumeBackingPath: e.blk,
		FsType:            "ext4",
		MountFlags:        []string{"noatime", "discard"},
		VolumeId:          "vol-1",
		CsiDriver:         "hostpath.csi.k8s.io",
		PodUid:            uid1,
		Metadata:          map[string]string{"csi.storage.k8s.io/pod.name": "web-0"},
	}
}

// rawBlock makes a good spec a raw block one (no filesystem fields), then applies mut.
func rawBlock(mut func(s *crustv1.VolumeSpec)) func(s *crustv1.VolumeSpec) {
	return func(s *crustv1.VolumeSpec) {
		s.VolumeMode, s.FsType, s.MountFlags = crustv1.VolumeMode_VOLUME_MODE_BLOCK, "", nil
		mut(s)
	}
}

func ptr[T any](v T) *T { return &v }

type result struct {
	checked *Checked
	err     error
}

// TestValidate holds every refusal case (field and reason) and the accepted cases of the package's input
// checks.
func TestValidate(t *testing.T) {
	e := newEnv(t)

	// stage runs v.Spec on the good spec changed by mut, and checks that the caller's spec is untouched.
	stage := func(v *Validator, mut func(s *crustv1.VolumeSpec)) func(t *testing.T) result {
		return func(t *testing.T) result {
			s := e.good()
			mut(s)
			before := proto.Clone(s)
			c, err := v.Spec(s)
			if !proto.Equal(s, before) {
				t.Errorf("Spec modified its argument: %v -> %v", before, s)
			}
			if c != nil && c.Spec == s {
				t.Errorf("Checked.Spec is the caller's spec, not a copy")
			}
			return result{c, err}
		}
	}
	spec := func(mut func(s *crustv1.VolumeSpec)) func(t *testing.T) result { return stage(e.v, mut) }
	specFile := func(mut func(s *crustv1.VolumeSpec)) func(t *testing.T) result { return stage(e.vFile, mut) }
	target := func(p string) func(s *crustv1.VolumeSpec) {
		return func(s *crustv1.VolumeSpec) { s.VolumeTargetPath = p }
	}
	backing := func(p string, vt crustv1.VolumeType) func(s *crustv1.VolumeSpec) {
		return func(s *crustv1.VolumeSpec) { s.VolumeBackingPath, s.VolumeType = p, vt }
	}
	flags := func(f ...string) func(s *crustv1.VolumeSpec) {
		return func(s *crustv1.VolumeSpec) { s.MountFlags = f }
	}
	metadata := func(md map[string]string) func(s *crustv1.VolumeSpec) {
		return func(s *crustv1.VolumeSpec) { s.Metadata = md }
	}
	plain := func(f func() error) func(t *testing.T) result {
		return func(*testing.T) result { return result{nil, f()} }
	}
	sandbox := func(id string) func(t *testing.T) result {
		return plain(func() error { return SandboxID("sandbox_id", id) })
	}
	endpoint := func(ep string) func(t *testing.T) result {
		return plain(func() error { return HandlerEndpoint("handler_endpoint", ep) })
	}
	blockDN := func(loop int) func(t *testing.T, c *Checked) {
		return func(t *testing.T, c *Checked) {
			want := e.loops[loop].dn()
			if !proto.Equal(c.DeviceNumber, want) || c.ResolvedBackingPath != e.blk {
				t.Errorf("got %v at %q, want %v at %q", c.DeviceNumber, c.ResolvedBackingPath, want, e.blk)
			}
		}
	}
	many := func(n int, f func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	const (
		tp  = "spec.volume_target_path"
		bp  = "spec.volume_backing_path"
		vt  = "spec.volume_type"
		fst = "spec.fs_type"
		sgp = "spec.supplemental_group_change_policy"
		blk = crustv1.VolumeType_VOLUME_TYPE_BLOCK
	)
	mf := func(i int) string { return fmt.Sprintf("spec.mount_flags[%d]", i) }
	md := func(k string) string { return fmt.Sprintf("spec.metadata[%q]", k) }

	tests := []struct {
		name   string
		run    func(t *testing.T) result
		field  string                         // "" when the input is accepted
		reason string                         // a substring of the refusal's reason
		check  func(t *testing.T, c *Checked) // for accepted specs
	}{
		// ---- refused: the spec itself
		{name: "nil spec", run: func(*testing.T) result { c, err := e.v.Spec(nil); return result{c, err} },
			field: "spec", reason: "is required"},

		// ---- refused: target path, string rules
		{name: "target empty", run: spec(target("")), field: tp, reason: "is required"},
		{name: "target relative", run: spec(target("var/lib/kubelet/pods/x")), field: tp, reason: "is not absolute"},
		{name: "target trailing slash", run: spec(target(e.target + "/")), field: tp, reason: "is not clean"},
		{name: "target double slash", run: spec(target(e.root + "//pods/x")), field: tp, reason: "is not clean"},
		{name: "target dot", run: spec(target(e.root + "/./pods/x")), field: tp, reason: "is not clean"},
		{name: "target dot-dot escaping", run: spec(target(e.root + "/pods/../../../etc")), field: tp, reason: "is not clean"},
		{name: "target NUL", run: spec(target(e.target + "\x00x")), field: tp, reason: "NUL byte"},
		{name: "target newline", run: spec(target(e.target + "\nx")), field: tp, reason: "control character"},
		{name: "target invalid UTF-8", run: spec(target(e.target + "\xff")), field: tp, reason: "not valid UTF-8"},
		{name: "target too long", run: spec(target(e.root + strings.Repeat("/abcdefgh", 460))), field: tp, reason: "at most 4096"},
		{name: "target component too long", run: spec(target(e.root + "/" + strings.Repeat("a", 256))), field: tp,
			reason: "component of 256 bytes"},
		// ---- refused: target path, place
		{name: "target is the kubelet root", run: spec(target(e.root)), field: tp, reason: "is the kubelet root itself"},
		{name: "target outside", run: spec(target("/etc/kubelet/pods/x")), field: tp, reason: "is not under the kubelet root"},
		{name: "target in a sibling with the root as prefix", run: spec(target(e.root + "x/pods/x")), field: tp,
			reason: "is not under the kubelet root"},
		{name: "target under the resolved root", run: spec(target(e.realRoot + "/pods/" + uid1 + "/v/mount")), field: tp,
			reason: "which the kubelet root resolves to"},
		{name: "target through a symlink", run: spec(target(e.csi + "/link/mount")), field: tp, reason: "link is a symlink"},
		{name: "target is a symlink", run: spec(target(e.csi + "/link")), field: tp, reason: "link is a symlink"},
		{name: "target is a dangling symlink", run: spec(target(e.csi + "/dangling")), field: tp, reason: "dangling is a symlink"},
		{name: "target below a dangling symlink", run: spec(target(e.csi + "/dangling/mount")), field: tp,
			reason: "dangling is a symlink"},
		{name: "target through a file", run: spec(target(e.root + "/pods/" + uid1 + "/afile/mount")), field: tp,
			reason: "afile is not a directory"},
		{name: "TargetPath names the given field", run: plain(func() error { return e.v.TargetPath("volume_target_path", "x") }),
			field: "volume_target_path", reason: "is not absolute"},
		// A lookup checks the name only: a path through a symlink names nothing held (it was refused at
		// stage), and is not refused.
		{name: "TargetName: a path through a symlink is a name", run: plain(func() error { return e.v.TargetName(tp, e.csi+"/link/mount") })},
		{name: "TargetName: outside the kubelet root", run: plain(func() error { return e.v.TargetName(tp, "/etc/kubelet/pods/x") }),
			field: tp, reason: "is not under the kubelet root"},
		{name: "TargetName: the string rules", run: plain(func() error { return e.v.TargetName(tp, e.root+"/pods/../x") }),
			field: tp, reason: "not clean"},

		// ---- refused: volume type
		{name: "type unknown", run: spec(backing(e.blk, 99)), field: vt, reason: "99 is not a known volume type"},
		{name: "type FILE not allowed", run: spec(backing(e.image, crustv1.VolumeType_VOLUME_TYPE_FILE)), field: vt,
			reason: "--allow-file-backed"},
		{name: "Device FILE not allowed", run: plain(func() error {
			_, _, err := e.v.Device("volume_backing_path", e.image, crustv1.VolumeType_VOLUME_TYPE_FILE)
			return err
		}), field: "volume_backing_path", reason: "--allow-file-backed"},
		{name: "Device type unknown", run: plain(func() error { _, _, err := e.v.Device("x", e.blk, 42); return err }),
			field: "x", reason: "42 is not known"},

		// ---- refused: backing path
		{name: "backing empty", run: spec(backing("", blk)), field: bp, reason: "is required"},
		{name: "backing relative", run: spec(backing("dev/loop200", blk)), field: bp, reason: "is not absolute"},
		{name: "backing NUL", run: spec(backing(e.blk+"\x00", blk)), field: bp, reason: "NUL byte"},
		{name: "backing control character", run: spec(backing(e.blk+"\t", blk)), field: bp, reason: "control character"},
		{name: "backing invalid UTF-8", run: spec(backing(e.blk+"\xfe", blk)), field: bp, reason: "not valid UTF-8"},
		{name: "backing too long", run: spec(backing(e.dev+strings.Repeat("/x", 2100), blk)), field: bp, reason: "at most 4096"},
		{name: "backing missing", run: spec(backing(e.dev+"/nope", blk)), field: bp, reason: "cannot be resolved"},
		{name: "backing dangling symlink", run: spec(backing(e.dangling, blk)), field: bp, reason: "cannot be resolved"},
		{name: "backing through a file", run: spec(backing(e.image+"/x", blk)), field: bp, reason: "cannot be resolved"},
		{name: "backing symlink out of the allow-list", run: spec(backing(e.escape, blk)), field: bp,
			reason: "matches none of the --device-allow patterns"},
		{name: "backing outside the allow-list", run: spec(backing(e.other, blk)), field: bp,
			reason: "matches none of the --device-allow patterns"},
		{name: "backing host /dev/null outside the allow-list", run: spec(backing("/dev/null", blk)), field: bp,
			reason: "matches none of the --device-allow patterns"},
		{name: "backing dot-dot out of the allow-list", run: spec(backing(e.dev+"/../outside/blk", blk)), field: bp,
			reason: "matches none of the --device-allow patterns"},
		{name: "BLOCK on a char device", run: spec(backing(e.chr, blk)), field: bp,
			reason: "is a character device, not a block device"},
		{name: "PMEM on a char device", run: spec(backing(e.chr, crustv1.VolumeType_VOLUME_TYPE_PMEM)), field: bp,
			reason: "is a character device, not a block device"},
		{name: "PMEM with I/O limits", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeBackingPath, s.VolumeType, s.IoLimits = e.blk, crustv1.VolumeType_VOLUME_TYPE_PMEM, &crustv1.IOLimits{TotalIops: 50}
		}), field: "spec.io_limits", reason: "nothing to throttle"},
		// Accepted PMEM backings are in TestPmemVolumes, which has a sysfs tree with pmem namespaces.
		{name: "PMEM on a loop device", run: spec(backing(e.blk, crustv1.VolumeType_VOLUME_TYPE_PMEM)), field: bp,
			reason: "is a loop device (/dev/" + filepath.Base(e.loops[0].path) + "), not persistent memory"},
		{name: "BLOCK on a regular file", run: spec(backing(e.image, blk)), field: bp,
			reason: "is a regular file, not a block device (an image file needs volume_type VOLUME_TYPE_FILE)"},
		{name: "BLOCK on a directory", run: spec(backing(e.dir, blk)), field: bp, reason: "is a directory, not a block device"},
		{name: "BLOCK on a FIFO", run: spec(backing(e.fifo, blk)), field: bp, reason: "is a FIFO, not a block device"},
		{name: "FILE on a block device", run: specFile(backing(e.blk, crustv1.VolumeType_VOLUME_TYPE_FILE)), field: bp,
			reason: "is a block device, not a regular file"},
		{name: "FILE on a char device", run: specFile(backing(e.chr, crustv1.VolumeType_VOLUME_TYPE_FILE)), field: bp,
			reason: "is a character device, not a regular file"},
		{name: "FILE on a directory", run: specFile(backing(e.dir, crustv1.VolumeType_VOLUME_TYPE_FILE)), field: bp,
			reason: "is a directory, not a regular file"},

		// ---- refused: fs type
		{name: "fs type empty", run: spec(func(s *crustv1.VolumeSpec) { s.FsType = "" }), field: fst, reason: "is required"},
		{name: "fs type vfat", run: spec(func(s *crustv1.VolumeSpec) { s.FsType = "vfat" }), field: fst,
			reason: `"vfat" is not one of ext4, ext3, xfs, btrfs`},
		{name: "fs type upper case", run: spec(func(s *crustv1.VolumeSpec) { s.FsType = "EXT4" }), field: fst, reason: "is not one of"},
		{name: "fs type with options", run: spec(func(s *crustv1.VolumeSpec) { s.FsType = "ext4,bind" }), field: fst, reason: "is not one of"},

		// ---- refused: mount flags
		{name: "flags too many", run: spec(flags(many(33, func(i int) string { return fmt.Sprintf("x-%d", i) })...)),
			field: "spec.mount_flags", reason: "has 33 options; at most 32"},
		{name: "flag empty", run: spec(flags("noatime", "")), field: mf(1), reason: "is empty"},
		{name: "flag too long", run: spec(flags("context=" + strings.Repeat("x", 249))), field: mf(0), reason: "257 bytes long; at most 256"},
		{name: "flag comma", run: spec(flags("noatime,nodev")), field: mf(0), reason: "contains a comma"},
		{name: "flag space", run: spec(flags("no atime")), field: mf(0), reason: "printable ASCII without spaces"},
		{name: "flag tab", run: spec(flags("noatime\t")), field: mf(0), reason: "printable ASCII without spaces"},
		{name: "flag newline", run: spec(flags("noatime\n")), field: mf(0), reason: "printable ASCII without spaces"},
		{name: "flag NUL", run: spec(flags("noatime\x00bind")), field: mf(0), reason: "printable ASCII without spaces"},
		{name: "flag DEL", run: spec(flags("noatime\x7f")), field: mf(0), reason: "printable ASCII without spaces"},
		{name: "flag non-ASCII", run: spec(flags("context=é")), field: mf(0), reason: "printable ASCII without spaces"},
		{name: "flag invalid UTF-8", run: spec(flags("a\xff")), field: mf(0), reason: "is not valid UTF-8"},
		{name: "flag bind", run: spec(flags("noatime", "bind")), field: mf(1), reason: "bind, move, remount or propagation"},
		{name: "flag rbind", run: spec(flags("rbind")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag move", run: spec(flags("move")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag remount", run: spec(flags("remount")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag shared", run: spec(flags("shared")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag rshared", run: spec(flags("rshared")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag slave", run: spec(flags("slave")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag rslave", run: spec(flags("rslave")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag private", run: spec(flags("private")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag rprivate", run: spec(flags("rprivate")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag unbindable", run: spec(flags("unbindable")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag runbindable", run: spec(flags("runbindable")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag make-shared", run: spec(flags("make-shared")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag make-rprivate", run: spec(flags("make-rprivate")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag upper-case BIND", run: spec(flags("BIND")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag bind with a value", run: spec(flags("bind=/etc")), field: mf(0), reason: "bind, move, remount or propagation"},
		{name: "flag ro without read_only", run: spec(flags("ro")), field: mf(0), reason: "contradicts read_only=false"},
		{name: "flag rw with read_only", run: spec(func(s *crustv1.VolumeSpec) { s.ReadOnly, s.MountFlags = true, []string{"rw"} }),
			field: mf(0), reason: "contradicts read_only=true"},
		{name: "flag twice", run: spec(flags("noatime", "nodev", "noatime")), field: mf(2), reason: `"noatime" is given twice`},

		// ---- refused: supplemental group and policy
		{name: "group negative", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = ptr[int64](-1) }),
			field: "spec.volume_supplemental_group", reason: "-1 is negative"},
		{name: "group above 2^31-1", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = ptr[int64](math.MaxInt32 + 1) }),
			field: "spec.volume_supplemental_group", reason: "2147483648 is larger than 2147483647"},
		{name: "policy without group", run: spec(func(s *crustv1.VolumeSpec) {
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH
		}), field: sgp, reason: "is set but volume_supplemental_group is not"},
		{name: "policy unknown", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeSupplementalGroup, s.SupplementalGroupChangePolicy = ptr[int64](1000), 9
		}), field: sgp, reason: "9 is not a known policy"},

		// ---- refused: volume mode
		{name: "mode unknown", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeMode = 7 }), field: "spec.volume_mode",
			reason: "7 is not a known volume mode"},
		{name: "mode block with fs type", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeMode, s.MountFlags = crustv1.VolumeMode_VOLUME_MODE_BLOCK, nil
		}), field: fst, reason: `must be unset for volume_mode VOLUME_MODE_BLOCK: the sandbox gets the raw device, with no filesystem (got "ext4")`},
		{name: "mode block with mount flags", run: spec(rawBlock(func(s *crustv1.VolumeSpec) { s.MountFlags = []string{"noatime"} })),
			field: "spec.mount_flags", reason: "must be unset for volume_mode VOLUME_MODE_BLOCK"},
		{name: "mode block with create_filesystem", run: spec(rawBlock(func(s *crustv1.VolumeSpec) { s.CreateFilesystem = true })),
			field: "spec.create_filesystem", reason: "must be unset for volume_mode VOLUME_MODE_BLOCK"},
		{name: "mode block with a group", run: spec(rawBlock(func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = ptr[int64](0) })),
			field: "spec.volume_supplemental_group", reason: "must be unset for volume_mode VOLUME_MODE_BLOCK"},
		{name: "mode block with a group policy", run: spec(rawBlock(func(s *crustv1.VolumeSpec) {
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS
		})), field: sgp, reason: "must be unset for volume_mode VOLUME_MODE_BLOCK"},
		{name: "mode block of a pmem volume", run: spec(rawBlock(backing(e.blk, crustv1.VolumeType_VOLUME_TYPE_PMEM))),
			field: "spec.volume_mode", reason: "VOLUME_MODE_BLOCK is refused for VOLUME_TYPE_PMEM"},
		{name: "mode block still checks the device", run: spec(rawBlock(backing(e.chr, blk))), field: bp,
			reason: "is a character device, not a block device"},
		{name: "mode filesystem still needs an fs type", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeMode, s.FsType = crustv1.VolumeMode_VOLUME_MODE_FILESYSTEM, ""
		}), field: fst, reason: "is required"},

		// ---- refused: identifiers
		{name: "volume id too long", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeId = strings.Repeat("v", 257) }),
			field: "spec.volume_id", reason: "257 bytes long; at most 256"},
		{name: "volume id control character", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeId = "vol\n1" }),
			field: "spec.volume_id", reason: "control character"},
		{name: "volume id invalid UTF-8", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeId = "vol\xff" }),
			field: "spec.volume_id", reason: "not valid UTF-8"},
		{name: "csi driver too long", run: spec(func(s *crustv1.VolumeSpec) { s.CsiDriver = strings.Repeat("d", 64) }),
			field: "spec.csi_driver", reason: "64 bytes long; at most 63"},
		{name: "csi driver leading dash", run: spec(func(s *crustv1.VolumeSpec) { s.CsiDriver = "-csi.example.com" }),
			field: "spec.csi_driver", reason: "is not a CSI driver name"},
		{name: "csi driver trailing dot", run: spec(func(s *crustv1.VolumeSpec) { s.CsiDriver = "csi.example.com." }),
			field: "spec.csi_driver", reason: "is not a CSI driver name"},
		{name: "csi driver underscore", run: spec(func(s *crustv1.VolumeSpec) { s.CsiDriver = "csi_example" }),
			field: "spec.csi_driver", reason: "is not a CSI driver name"},
		{name: "csi driver slash", run: spec(func(s *crustv1.VolumeSpec) { s.CsiDriver = "a/b" }),
			field: "spec.csi_driver", reason: "is not a CSI driver name"},
		{name: "pod uid upper case", run: spec(func(s *crustv1.VolumeSpec) { s.PodUid = strings.ToUpper(uid1) }),
			field: "spec.pod_uid", reason: "is not a pod UID"},
		{name: "pod uid path", run: spec(func(s *crustv1.VolumeSpec) { s.PodUid = "../etc" }),
			field: "spec.pod_uid", reason: "is not a pod UID"},
		{name: "pod uid too long", run: spec(func(s *crustv1.VolumeSpec) { s.PodUid = uid1 + "0" }),
			field: "spec.pod_uid", reason: "37 bytes long; at most 36"},
		{name: "pod uid not the target's pod", run: spec(func(s *crustv1.VolumeSpec) { s.PodUid = uid2 }),
			field: "spec.pod_uid", reason: "does not match the pod directory"},
		{name: "pod.uid metadata alone, not the target's pod", run: spec(func(s *crustv1.VolumeSpec) {
			s.PodUid = ""
			s.Metadata = map[string]string{"csi.storage.k8s.io/pod.uid": uid2}
		}), field: `spec.metadata["csi.storage.k8s.io/pod.uid"]`, reason: "does not match the pod directory"},

		// ---- refused: metadata
		{name: "metadata too many pairs", run: specFile(metadata(func() map[string]string {
			m := map[string]string{}
			for _, k := range append(volume.DefaultMetadataKeys(), e.extraKeys...)[:17] {
				m[k] = "x"
			}
			return m
		}())), field: "spec.metadata", reason: "has 17 pairs; at most 16"},
		{name: "metadata empty key", run: spec(metadata(map[string]string{"": "x"})), field: "spec.metadata", reason: "has an empty key"},
		{name: "metadata key too long", run: spec(metadata(map[string]string{strings.Repeat("k", 254): "x"})),
			field: "spec.metadata", reason: "has a key of 254 bytes"},
		{name: "metadata key not allowed", run: spec(metadata(map[string]string{"foo": "x"})),
			field: md("foo"), reason: "is not an allowed metadata key"},
		{name: "metadata key allowed only by another config", run: spec(metadata(map[string]string{"example.com/k0": "x"})),
			field: md("example.com/k0"), reason: "is not an allowed metadata key"},
		{name: "metadata key case differs", run: spec(metadata(map[string]string{"EncryptionKey": "x"})),
			field: md("EncryptionKey"), reason: "is not an allowed metadata key"},
		{name: "metadata fsGroup", run: spec(metadata(map[string]string{"fsGroup": "1000"})),
			field: md("fsGroup"), reason: "set the typed field spec.volume_supplemental_group instead"},
		{name: "metadata fsGroupChangePolicy", run: spec(metadata(map[string]string{"fsGroupChangePolicy": "Always"})),
			field: md("fsGroupChangePolicy"), reason: "set the typed field spec.supplemental_group_change_policy instead"},
		// Kata's createFilesystem key is taken, spelt exactly, and folded into create_filesystem.
		{name: "metadata createFilesystem true", run: spec(metadata(map[string]string{"createFilesystem": "true", "encryptionKey": "ephemeral"})),
			check: func(t *testing.T, c *Checked) {
				if !c.Spec.GetCreateFilesystem() || len(c.Spec.GetMetadata()) != 1 || c.Spec.GetMetadata()["encryptionKey"] != "ephemeral" {
					t.Errorf("create_filesystem %v, metadata %v; want true and only encryptionKey", c.Spec.GetCreateFilesystem(), c.Spec.GetMetadata())
				}
			}},
		{name: "metadata createFilesystem false", run: spec(metadata(map[string]string{"createFilesystem": "false"})),
			check: func(t *testing.T, c *Checked) {
				if c.Spec.GetCreateFilesystem() || c.Spec.GetMetadata() != nil {
					t.Errorf("create_filesystem %v, metadata %v; want false and none", c.Spec.GetCreateFilesystem(), c.Spec.GetMetadata())
				}
			}},
		{name: "metadata createFilesystem true beside the typed field", run: spec(func(s *crustv1.VolumeSpec) {
			s.CreateFilesystem, s.Metadata = true, map[string]string{"createFilesystem": "true"}
		}), check: func(t *testing.T, c *Checked) {
			if !c.Spec.GetCreateFilesystem() || c.Spec.GetMetadata() != nil {
				t.Errorf("create_filesystem %v, metadata %v; want true and none", c.Spec.GetCreateFilesystem(), c.Spec.GetMetadata())
			}
		}},
		{name: "metadata createFilesystem false against the typed field", run: spec(func(s *crustv1.VolumeSpec) {
			s.CreateFilesystem, s.Metadata = true, map[string]string{"createFilesystem": "false"}
		}), field: md("createFilesystem"), reason: "spec.create_filesystem is true"},
		{name: "metadata createFilesystem not a boolean", run: spec(metadata(map[string]string{"createFilesystem": "yes"})),
			field: md("createFilesystem"), reason: `want "true" or "false"`},
		{name: "metadata createFilesystem of another case", run: spec(metadata(map[string]string{"createfilesystem": "true"})),
			field: md("createfilesystem"), reason: "set the typed field spec.create_filesystem instead"},
		{name: "metadata typed key in other case", run: specFile(metadata(map[string]string{"FSGROUP": "1000"})),
			field: md("FSGROUP"), reason: "set the typed field spec.volume_supplemental_group instead"},
		{name: "metadata value too long", run: spec(metadata(map[string]string{"encryptionKey": strings.Repeat("s", 4097)})),
			field: md("encryptionKey"), reason: "value of 4097 bytes; at most 4096"},
		{name: "metadata value invalid UTF-8", run: spec(metadata(map[string]string{"encryptionKey": "\xff"})),
			field: md("encryptionKey"), reason: "not valid UTF-8"},
		{name: "metadata pod uid differs from pod_uid", run: spec(metadata(map[string]string{volume.PodUIDKey: uid2})),
			field: md(volume.PodUIDKey), reason: "does not match pod_uid"},
		{name: "metadata first bad key in sorted order", run: spec(metadata(map[string]string{"zz": "x", "aa": "x", "mm": "x"})),
			field: md("aa"), reason: "is not an allowed metadata key"},

		// ---- refused: sandbox id
		{name: "sandbox id empty", run: sandbox(""), field: "sandbox_id", reason: "is required"},
		{name: "sandbox id too long", run: sandbox(strings.Repeat("a", 129)), field: "sandbox_id", reason: "129 bytes long; at most 128"},
		{name: "sandbox id dot", run: sandbox(".hidden"), field: "sandbox_id", reason: "begins with '.'"},
		{name: "sandbox id dot-dot", run: sandbox(".."), field: "sandbox_id", reason: "begins with '.'"},
		{name: "sandbox id mountInfo.json", run: sandbox("mountInfo.json"), field: "sandbox_id", reason: "Kata's descriptor file"},
		{name: "sandbox id slash", run: sandbox("a/b"), field: "sandbox_id", reason: "other than letters, digits"},
		{name: "sandbox id space", run: sandbox("a b"), field: "sandbox_id", reason: "other than letters, digits"},
		{name: "sandbox id NUL", run: sandbox("a\x00"), field: "sandbox_id", reason: "other than letters, digits"},
		{name: "sandbox id non-ASCII", run: sandbox("sandbox-é"), field: "sandbox_id", reason: "other than letters, digits"},

		// ---- refused: handler endpoint
		{name: "endpoint bare path", run: endpoint("/run/h.sock"), field: "handler_endpoint", reason: "is not a unix socket address"},
		{name: "endpoint tcp", run: endpoint("tcp://10.0.0.1:9000"), field: "handler_endpoint", reason: "is not a unix socket address"},
		{name: "endpoint host:port", run: endpoint("10.0.0.1:9000"), field: "handler_endpoint", reason: "is not a unix socket address"},
		{name: "endpoint dns", run: endpoint("dns:///handler:9000"), field: "handler_endpoint", reason: "is not a unix socket address"},
		{name: "endpoint passthrough", run: endpoint("passthrough:///unix:///run/h.sock"), field: "handler_endpoint",
			reason: "is not a unix socket address"},
		{name: "endpoint abstract", run: endpoint("unix-abstract:handler"), field: "handler_endpoint", reason: "is not a unix socket address"},
		{name: "endpoint upper-case scheme", run: endpoint("UNIX:///run/h.sock"), field: "handler_endpoint",
			reason: "is not a unix socket address"},
		{name: "endpoint with a host", run: endpoint("unix://host/run/h.sock"), field: "handler_endpoint", reason: "names a host"},
		{name: "endpoint no path", run: endpoint("unix:"), field: "handler_endpoint", reason: "has no socket path"},
		{name: "endpoint no path after //", run: endpoint("unix://"), field: "handler_endpoint", reason: "has no socket path"},
		{name: "endpoint relative", run: endpoint("unix:run/h.sock"), field: "handler_endpoint", reason: "relative socket path"},
		{name: "endpoint not clean", run: endpoint("unix:///run/x/../h.sock"), field: "handler_endpoint", reason: "not clean"},
		{name: "endpoint percent-encoding", run: endpoint("unix:///run/%2e%2e/h.sock"), field: "handler_endpoint", reason: `contains '%'`},
		{name: "endpoint query", run: endpoint("unix:///run/h.sock?x=1"), field: "handler_endpoint", reason: `contains '?'`},
		{name: "endpoint fragment", run: endpoint("unix:///run/h.sock#x"), field: "handler_endpoint", reason: `contains '#'`},
		{name: "endpoint control character", run: endpoint("unix:///run/h.sock\n"), field: "handler_endpoint", reason: "control character"},
		{name: "endpoint NUL", run: endpoint("unix:///run/h\x00.sock"), field: "handler_endpoint", reason: "control character"},
		{name: "endpoint path too long", run: endpoint("unix:///run/" + strings.Repeat("s", 103)), field: "handler_endpoint",
			reason: "socket path of 108 bytes; at most 107"},

		// ---- accepted: specs
		{name: "good spec, normalised to BLOCK", run: spec(func(*crustv1.VolumeSpec) {}), check: func(t *testing.T, c *Checked) {
			blockDN(0)(t, c)
			want := e.good()
			want.VolumeType = crustv1.VolumeType_VOLUME_TYPE_BLOCK
			if !proto.Equal(c.Spec, want) {
				t.Errorf("Spec = %v, want %v", c.Spec, want)
			}
		}},
		{name: "device through a symlink", run: spec(backing(e.link, blk)), check: func(t *testing.T, c *Checked) {
			blockDN(0)(t, c)
			if c.Spec.VolumeBackingPath != e.link {
				t.Errorf("backing path %q was rewritten", c.Spec.VolumeBackingPath)
			}
		}},
		{name: "device path with dot-dot inside the allow-list", run: spec(backing(e.dev+"/by-id/../loop200", blk)), check: blockDN(0)},
		{name: "FILE when allowed", run: specFile(backing(e.image, crustv1.VolumeType_VOLUME_TYPE_FILE)), check: func(t *testing.T, c *Checked) {
			var st unix.Stat_t
			must(t, unix.Stat(e.image, &st))
			want := &crustv1.DeviceNumber{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), Inode: st.Ino}
			if !proto.Equal(c.DeviceNumber, want) || c.ResolvedBackingPath != e.image || want.Inode == 0 {
				t.Errorf("got %v at %q, want %v at %q", c.DeviceNumber, c.ResolvedBackingPath, want, e.image)
			}
		}},
		{name: "mode block, read-only", run: spec(rawBlock(func(s *crustv1.VolumeSpec) { s.ReadOnly = true })), check: func(t *testing.T, c *Checked) {
			blockDN(0)(t, c)
			if c.Spec.VolumeMode != crustv1.VolumeMode_VOLUME_MODE_BLOCK || c.Spec.FsType != "" || !c.Spec.ReadOnly {
				t.Errorf("spec = %v", c.Spec)
			}
		}},
		{name: "mode block of an image file", run: specFile(rawBlock(backing(e.image, crustv1.VolumeType_VOLUME_TYPE_FILE)))},
		{name: "mode unspecified is kept", run: spec(func(*crustv1.VolumeSpec) {}), check: func(t *testing.T, c *Checked) {
			if c.Spec.VolumeMode != crustv1.VolumeMode_VOLUME_MODE_UNSPECIFIED {
				t.Errorf("volume_mode = %v, want it kept UNSPECIFIED", c.Spec.VolumeMode)
			}
		}},
		{name: "target whose pod directory does not exist yet", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeTargetPath, s.PodUid = e.root+"/pods/"+uid2+"/volumes/kubernetes.io~csi/pv9/mount", uid2
		})},
		{name: "target is an existing directory", run: spec(target(e.csi + "/pv1"))},
		{name: "target is an existing file", run: spec(target(e.root + "/pods/" + uid1 + "/afile"))},
		{name: "target outside pods/ with a pod uid", run: spec(target(e.root + "/plugins/example/mount"))},
		{name: "target of 4096 bytes", run: spec(func(s *crustv1.VolumeSpec) {
			s.PodUid = ""
			p := e.root + strings.Repeat("/abcdefgh", 460)
			s.VolumeTargetPath = p[:4096-1] + "z"
		})},
		{name: "group 0 gets policy ALWAYS", run: spec(func(s *crustv1.VolumeSpec) { s.VolumeSupplementalGroup = ptr[int64](0) }),
			check: func(t *testing.T, c *Checked) {
				if p := c.Spec.SupplementalGroupChangePolicy; p != crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS {
					t.Errorf("policy = %v", p)
				}
			}},
		{name: "group 2^31-1 keeps its policy", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeSupplementalGroup = ptr[int64](math.MaxInt32)
			s.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH
		}), check: func(t *testing.T, c *Checked) {
			if p := c.Spec.SupplementalGroupChangePolicy; p != crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH {
				t.Errorf("policy = %v", p)
			}
		}},
		{name: "no group leaves the policy unspecified", run: spec(func(*crustv1.VolumeSpec) {}), check: func(t *testing.T, c *Checked) {
			if c.Spec.SupplementalGroupChangePolicy != crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_UNSPECIFIED {
				t.Errorf("policy = %v", c.Spec.SupplementalGroupChangePolicy)
			}
		}},
		{name: "ro with read_only", run: spec(func(s *crustv1.VolumeSpec) { s.ReadOnly, s.MountFlags = true, []string{"ro"} })},
		{name: "rw without read_only", run: spec(flags("rw"))},
		{name: "32 flags", run: spec(flags(many(32, func(i int) string { return fmt.Sprintf("x-opt%d=1", i) })...))},
		{name: "flag of 256 bytes", run: spec(flags("context=" + strings.Repeat("x", 248)))},
		{name: "flags with values and names that only contain bind", run: spec(flags("context=system_u:object_r:x:s0", "nobind", "bindx", "x-make-shared"))},
		{name: "no optional fields", run: spec(func(s *crustv1.VolumeSpec) {
			s.MountFlags, s.VolumeId, s.CsiDriver, s.PodUid, s.Metadata = nil, "", "", "", nil
		})},
		{name: "identifiers at their limits", run: spec(func(s *crustv1.VolumeSpec) {
			s.VolumeId, s.CsiDriver = strings.Repeat("v", 256), "A"+strings.Repeat("b-.", 20)+"c1"
		})},
		{name: "built-in metadata keys", run: spec(metadata(map[string]string{
			"encryptionKey": strings.Repeat("s", 4096), "csi.storage.k8s.io/pod.name": "web-0",
			"csi.storage.k8s.io/pod.namespace": "default", volume.PodUIDKey: uid1,
			"csi.storage.k8s.io/serviceAccount.name": "sa", "csi.storage.k8s.io/ephemeral": "false",
		}))},
		{name: "16 metadata pairs with configured keys", run: specFile(metadata(func() map[string]string {
			m := map[string]string{}
			for _, k := range append(volume.DefaultMetadataKeys(), e.extraKeys...)[:16] {
				m[k] = "x"
			}
			m[volume.PodUIDKey] = uid1
			return m
		}()))},
		{name: "configured key of 253 bytes", run: specFile(metadata(map[string]string{strings.Repeat("k", 253): "x"}))},

		// ---- accepted: sandbox ids and endpoints
		{name: "sandbox id kata", run: sandbox("3f1e2d4c5b6a0b7e1c3a5d2f4c899a613f1e2d4c5b6a0b7e1c3a5d2f4c899a61")},
		{name: "sandbox id punctuation", run: sandbox("pod_1.sandbox-A")},
		{name: "sandbox id of 128", run: sandbox(strings.Repeat("a", 128))},
		{name: "endpoint empty", run: endpoint("")},
		{name: "endpoint unix:///", run: endpoint("unix:///run/handler/h.sock")},
		{name: "endpoint unix:/", run: endpoint("unix:/run/handler/h.sock")},
		{name: "endpoint path of 107", run: endpoint("unix:///run/" + strings.Repeat("s", 102))},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.run(t)
			if tc.field == "" {
				if r.err != nil {
					t.Fatalf("refused: %v", r.err)
				}
				if tc.check != nil {
					tc.check(t, r.checked)
				}
				return
			}
			if r.err == nil {
				t.Fatalf("accepted, want a refusal of %s (%q)", tc.field, tc.reason)
			}
			if r.checked != nil {
				t.Errorf("returned a Checked with the error")
			}
			if !errors.Is(r.err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %v is not ErrInvalidArgument", r.err)
			}
			var fe *errdefs.FieldError
			if !errors.As(r.err, &fe) {
				t.Fatalf("error %v is not a *FieldError", r.err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Reason, tc.reason) {
				t.Errorf("got %s: %s\nwant %s: ...%s...", fe.Field, fe.Reason, tc.field, tc.reason)
			}
		})
	}
}

func TestNew(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	tmp := t.TempDir()
	file := tmp + "/file"
	must(t, os.WriteFile(file, nil, 0o644))
	tests := []struct {
		name   string
		cfg    Config
		errSub string // "" when accepted
	}{
		{"ok", Config{KubeletDir: tmp}, ""},
		{"ok with trailing slash", Config{KubeletDir: tmp + "/"}, ""},
		{"empty kubelet dir", Config{}, "kubelet dir is empty"},
		{"relative kubelet dir", Config{KubeletDir: "var/lib/kubelet"}, "not absolute"},
		{"root kubelet dir", Config{KubeletDir: "/"}, `must not be "/"`},
		{"missing kubelet dir", Config{KubeletDir: tmp + "/missing"}, "no such file"},
		{"kubelet dir is a file", Config{KubeletDir: file}, "not a directory"},
		{"malformed pattern", Config{KubeletDir: tmp, DeviceAllow: []string{"/dev/["}}, "syntax error in pattern"},
		{"relative pattern", Config{KubeletDir: tmp, DeviceAllow: []string{"dev/*"}}, "not absolute"},
		{"empty metadata key", Config{KubeletDir: tmp, MetadataKeys: []string{""}}, "empty metadata key"},
		{"long metadata key", Config{KubeletDir: tmp, MetadataKeys: []string{strings.Repeat("k", 254)}}, "longer than 253"},
		{"typed metadata key", Config{KubeletDir: tmp, MetadataKeys: []string{"fsGroup"}}, "typed field volume_supplemental_group"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := New(tc.cfg)
			switch {
			case tc.errSub == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.errSub == "" && v.KubeletDir() != filepath.Clean(tc.cfg.KubeletDir):
				t.Errorf("KubeletDir() = %q", v.KubeletDir())
			case tc.errSub != "" && (err == nil || !strings.Contains(err.Error(), tc.errSub)):
				t.Fatalf("New: %v, want an error containing %q", err, tc.errSub)
			}
		})
	}
}

func TestDefaultDeviceAllow(t *testing.T) {
	e := newEnv(t)
	v, err := New(Config{KubeletDir: e.root})
	must(t, err)
	// e.blk is not under /dev, so only the allow-list can refuse it; /dev/null is under /dev but a char device.
	if _, _, err := v.Device("d", e.blk, 0); err == nil || !strings.Contains(err.Error(), `["/dev/*"]`) {
		t.Errorf("Device(%s) = %v, want a refusal naming /dev/*", e.blk, err)
	}
	if _, _, err := v.Device("d", "/dev/null", 0); err == nil || !strings.Contains(err.Error(), "character device") {
		t.Errorf("Device(/dev/null) = %v, want the character device refusal", err)
	}
}

// TestSameDevice checks the claim-time comparison: the staged device is still there, or the refusal is a
// failed precondition (not invalid input) that says what changed.
func TestSameDevice(t *testing.T) {
	loops := realLoops(t)
	tests := []struct {
		name   string
		file   bool                                  // stage the image file instead of the block device
		change func(t *testing.T, e *env) *Validator // changes the world; returns the validator to claim with (nil: e.vFile)
		errSub string                                // "" when the claim may go ahead
	}{
		{name: "unchanged block device", errSub: ""},
		{name: "unchanged image file", file: true, errSub: ""},
		{name: "device node replaced", change: func(t *testing.T, e *env) *Validator {
			must(t, os.Remove(e.blk))
			must(t, unix.Mknod(e.blk, unix.S_IFBLK|0o600, e.loops[1].mkdev()))
			return nil
		}, errSub: "is now device " + loops[1].String() + ", not " + loops[0].String()},
		{name: "symlink retargeted", change: func(t *testing.T, e *env) *Validator {
			must(t, os.Remove(e.link))
			must(t, os.Symlink("../loop201", e.link))
			return nil
		}, errSub: "now resolves to"},
		{name: "device gone", change: func(t *testing.T, e *env) *Validator {
			must(t, os.Remove(e.blk))
			return nil
		}, errSub: "cannot be resolved"},
		{name: "replaced by a char device", change: func(t *testing.T, e *env) *Validator {
			must(t, os.Remove(e.blk))
			must(t, unix.Mknod(e.blk, unix.S_IFCHR|0o600, e.loops[0].mkdev()))
			return nil
		}, errSub: "is a character device"},
		{name: "allow-list narrowed", change: func(t *testing.T, e *env) *Validator {
			v, err := New(Config{KubeletDir: e.root, DeviceAllow: []string{e.dev + "/nvme*", "/dev/loop*"}, AllowFileBacked: true})
			must(t, err)
			return v
		}, errSub: "matches none of the --device-allow patterns"},
		{name: "image file replaced", file: true, change: func(t *testing.T, e *env) *Validator {
			must(t, os.Rename(e.image, e.image+".old"))
			must(t, os.WriteFile(e.image, nil, 0o600))
			return nil
		}, errSub: "inode"},
		{name: "file-backed volumes turned off", file: true, change: func(_ *testing.T, e *env) *Validator {
			return e.v
		}, errSub: "--allow-file-backed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.good()
			s.VolumeBackingPath = e.link
			if tc.file {
				s.VolumeBackingPath, s.VolumeType = e.image, crustv1.VolumeType_VOLUME_TYPE_FILE
			}
			c, err := e.vFile.Spec(s)
			must(t, err)
			vol := &crustv1.Volume{Spec: c.Spec, ResolvedBackingPath: c.ResolvedBackingPath, DeviceNumber: c.DeviceNumber}
			v := e.vFile
			if tc.change != nil {
				if nv := tc.change(t, e); nv != nil {
					v = nv
				}
			}
			err = v.SameDevice(vol)
			if tc.errSub == "" {
				if err != nil {
					t.Fatalf("SameDevice: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errSub) {
				t.Fatalf("SameDevice = %v, want an error containing %q", err, tc.errSub)
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("SameDevice = %v: want ErrFailedPrecondition only", err)
			}
		})
	}
}

// dev and suid would bring device files and set-user-id programs into the sandbox from the volume: they
// are refused unless the operator allows them, by name; the harmless options pass.
func TestPrivilegedMountOptions(t *testing.T) {
	e := newEnv(t)
	withFlags := func(flags ...string) *crustv1.VolumeSpec {
		s := e.good()
		s.MountFlags = flags
		return s
	}
	for _, f := range []string{"dev", "suid", "SUID"} {
		_, err := e.v.Spec(withFlags("noatime", f))
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != "spec.mount_flags[1]" || !strings.Contains(fe.Reason, "--allow-mount-option") {
			t.Errorf("%q: %v; want it refused, naming the field and the flag that allows it", f, err)
		}
	}
	if _, err := e.v.Spec(withFlags("nodev", "nosuid", "exec", "noexec")); err != nil {
		t.Errorf("harmless options: %v", err)
	}
	allowing, err := New(Config{KubeletDir: e.root, DeviceAllow: e.allow, AllowMountOptions: []string{"dev"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := allowing.Spec(withFlags("dev")); err != nil {
		t.Errorf("dev, allowed: %v", err)
	}
	if _, err := allowing.Spec(withFlags("suid")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("suid, only dev allowed: %v", err)
	}
	if _, err := New(Config{KubeletDir: e.root, AllowMountOptions: []string{"exec"}}); err == nil {
		t.Error("allowing an option that needs no allowing was accepted")
	}
}
