// Package validate holds every check crustd makes on caller input before it writes anything: a volume spec
// (target path, backing device, fs type, mount options, fsGroup, identifiers, metadata), a sandbox id and a
// handler endpoint.
//
// Every refusal is an *errdefs.FieldError, so errors.Is(err, errdefs.ErrInvalidArgument) holds and the
// message names the API field (snake_case, with its path, such as "spec.mount_flags[2]") and the reason.
// The one exception is SameDevice, a claim-time check whose refusals are errdefs.ErrFailedPrecondition.
// Nothing in this package changes anything on disk.
//
// The checks that look at the file system (no symlink in the target path, what the backing path resolves
// to) hold at the moment they are made; crustd never writes through the target path, and it checks the
// device again at claim time (SameDevice).
package validate

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"crust.dev/crust/api/volume"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/hostdev"
)

// DefaultDeviceAllow is the device allow-list used when Config.DeviceAllow is empty.
var DefaultDeviceAllow = []string{"/dev/*"}

// Config says what a Validator accepts. It mirrors crustd's flags.
type Config struct {
	// KubeletDir is the kubelet root directory (--kubelet-dir) in the form target paths use, such as
	// /var/lib/kubelet. It must exist. It may be a symlink or lie under one (/var/lib/kubelet ->
	// /data/kubelet): New resolves it once, and target paths must still be given under this configured
	// form.
	KubeletDir string
	// DeviceAllow holds filepath.Match patterns (--device-allow); a backing path is accepted only when
	// its symlink-resolved form matches one of them. This applies to image files too. Empty means
	// DefaultDeviceAllow. Note that "*" does not match "/": "/dev/*" allows /dev/dm-3 (what /dev/mapper/x
	// and /dev/vg/lv resolve to) but not a path in a subdirectory of /dev.
	DeviceAllow []string
	// DeviceAllowKinds are the kinds of block device accepted (--device-allow-kind; see hostdev.Kinds),
	// decided from what the kernel says about the device's number, never from its name. Empty means every
	// kind. A block device must be admitted by DeviceAllow and by DeviceAllowKinds; image files are
	// admitted by DeviceAllow alone.
	DeviceAllowKinds []string
	// Sysfs is where sysfs is mounted, which says what each block device number is; "" means /sys.
	// Tests of the packages above this one point it at a tree made by hostdev/sysfstree.
	Sysfs string
	// AllowFileBacked accepts VOLUME_TYPE_FILE, a raw image in a regular file (--allow-file-backed).
	AllowFileBacked bool
	// MetadataKeys are metadata keys accepted besides the built-in ones (volume.DefaultMetadataKeys):
	// encryptionKey, crust.dev/encryption-integrity and csi.storage.k8s.io/ pod.name, pod.namespace,
	// pod.uid, serviceAccount.name and ephemeral. The Kata
	// keys that have a typed field (fsGroup, fsGroupChangePolicy, createFilesystem) cannot be added.
	MetadataKeys []string
	// AllowMountOptions are the privileged mount options (PrivilegedMountOptions: dev, suid) accepted
	// in mount_flags (--allow-mount-option); none by default.
	AllowMountOptions []string
}

// PrivilegedMountOptions are the mount options refused unless an operator allows them: device files
// and set-user-id programs on a volume are a way into the sandbox's kernel or its root.
var PrivilegedMountOptions = []string{"dev", "suid"}

// Validator checks requests against a Config. It is safe for concurrent use.
type Validator struct {
	root      string // kubelet root as configured (clean, absolute)
	realRoot  string // kubelet root with symlinks resolved
	allow     []string
	kinds     map[hostdev.Kind]bool // nil: every kind
	sysfs     hostdev.Sysfs
	allowFile bool
	metaKeys  map[string]bool
	// allowedOpts are the PrivilegedMountOptions the operator allows.
	allowedOpts map[string]bool
}

// Checked is a spec that passed Spec, with what was learnt about its device.
type Checked struct {
	// Spec is a normalised copy of the request's spec: volume_type UNSPECIFIED becomes BLOCK,
	// supplemental_group_change_policy UNSPECIFIED becomes ALWAYS when a supplemental group is set, and
	// io_limits of zeros (no limit) is unset. volume_mode is kept as given (UNSPECIFIED is the filesystem
	// mode), so that a spec staged again compares equal to the one stored. The caller's spec is not
	// modified.
	Spec *crustv1.VolumeSpec
	// ResolvedBackingPath is the backing path with every symlink resolved; it matched the allow-list.
	ResolvedBackingPath string
	// DeviceNumber identifies the device (or the image file) as it was when checked.
	DeviceNumber *crustv1.DeviceNumber
}

// New returns a Validator for cfg. It fails when KubeletDir is not an existing directory (or is "/"),
// when a DeviceAllow pattern is malformed or not absolute, when a DeviceAllowKinds entry is not a kind, or when a MetadataKeys entry is empty, too
// long, or one of the Kata keys that have a typed field.
func New(cfg Config) (*Validator, error) {
	if cfg.KubeletDir == "" {
		return nil, errors.New("validate: kubelet dir is empty")
	}
	if !filepath.IsAbs(cfg.KubeletDir) {
		return nil, fmt.Errorf("validate: kubelet dir %q is not absolute", cfg.KubeletDir)
	}
	root := filepath.Clean(cfg.KubeletDir)
	if root == "/" {
		return nil, errors.New(`validate: kubelet dir must not be "/"`)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("validate: kubelet dir: %w", err)
	}
	if fi, err := os.Stat(realRoot); err != nil {
		return nil, fmt.Errorf("validate: kubelet dir: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("validate: kubelet dir %q is not a directory", root)
	}

	allow := cfg.DeviceAllow
	if len(allow) == 0 {
		allow = DefaultDeviceAllow
	}
	for _, p := range allow {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("validate: device allow pattern %q is not absolute", p)
		}
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("validate: device allow pattern %q: %w", p, err)
		}
	}

	var kinds map[hostdev.Kind]bool
	for _, s := range cfg.DeviceAllowKinds {
		k, err := hostdev.ParseKind(s)
		if err != nil {
			return nil, fmt.Errorf("validate: device allow kind: %w", err)
		}
		if kinds == nil {
			kinds = map[hostdev.Kind]bool{}
		}
		kinds[k] = true
	}

	allowedOpts := map[string]bool{}
	for _, o := range cfg.AllowMountOptions {
		if !slices.Contains(PrivilegedMountOptions, o) {
			return nil, fmt.Errorf("validate: mount option %q is not one that needs allowing (%s)", o, strings.Join(PrivilegedMountOptions, ", "))
		}
		allowedOpts[o] = true
	}

	keys := map[string]bool{}
	for _, k := range volume.DefaultMetadataKeys() {
		keys[k] = true
	}
	for _, k := range cfg.MetadataKeys {
		switch {
		case k == "":
			return nil, errors.New("validate: empty metadata key in the allow-list")
		case len(k) > maxMetadataKeyLen:
			return nil, fmt.Errorf("validate: metadata key %q is longer than %d bytes", k, maxMetadataKeyLen)
		case volume.TypedField(k) != "":
			return nil, fmt.Errorf("validate: metadata key %q cannot be allowed: it has the typed field %s",
				k, volume.TypedField(k))
		}
		keys[k] = true
	}

	return &Validator{
		root:        root,
		realRoot:    realRoot,
		allow:       append([]string(nil), allow...),
		kinds:       kinds,
		sysfs:       hostdev.Sysfs{Root: cfg.Sysfs},
		allowFile:   cfg.AllowFileBacked,
		metaKeys:    keys,
		allowedOpts: allowedOpts,
	}, nil
}

// KubeletDir returns the kubelet root as configured (cleaned): the form target paths must use.
func (v *Validator) KubeletDir() string { return v.root }

// Spec checks a StageVolume spec and returns its normalised copy with the resolved device: volume_type
// BLOCK when unspecified, the group change policy Always when a group is set without one, and Kata's
// createFilesystem metadata ("true" or "false") taken out of the metadata into create_filesystem (true
// when either says true; "false" beside create_filesystem true is refused). A nil error
// means every rule held: spec.volume_target_path passes TargetPath; spec.volume_backing_path passes
// Device for the spec's volume type; volume_mode is known; in the filesystem mode fs_type, mount_flags,
// the supplemental group and its policy are within their allow-lists and limits, and in the raw block
// mode they and create_filesystem are unset; volume_id, csi_driver, pod_uid and metadata are within
// their allow-lists and limits; io_limits pass volume.CheckIOLimits. Otherwise the error is a *errdefs.FieldError
// for the first field that failed. Checks that need no file system run
// first.
func (v *Validator) Spec(spec *crustv1.VolumeSpec) (*Checked, error) {
	if spec == nil {
		return nil, errdefs.Field("spec", "is required")
	}
	if err := pathString("spec.volume_target_path", spec.GetVolumeTargetPath()); err != nil {
		return nil, err
	}
	vt := spec.GetVolumeType()
	if err := v.volumeType("spec.volume_type", vt); err != nil {
		return nil, err
	}
	if err := volumeMode("spec.volume_mode", spec.GetVolumeMode(), vt); err != nil {
		return nil, err
	}
	if spec.GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
		if err := noFilesystem(spec); err != nil {
			return nil, err
		}
	} else {
		if err := fsType("spec.fs_type", spec.GetFsType()); err != nil {
			return nil, err
		}
		if err := mountFlags("spec.mount_flags", spec.GetMountFlags(), spec.GetReadOnly(), v.allowedOpts); err != nil {
			return nil, err
		}
		if err := supplementalGroup(spec); err != nil {
			return nil, err
		}
	}
	if err := volumeID("spec.volume_id", spec.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := csiDriver("spec.csi_driver", spec.GetCsiDriver()); err != nil {
		return nil, err
	}
	if err := podUID("spec.pod_uid", spec.GetPodUid()); err != nil {
		return nil, err
	}
	if err := v.metadata("spec.metadata", spec.GetMetadata()); err != nil {
		return nil, err
	}
	if err := v.consistentPodUID(spec); err != nil {
		return nil, err
	}
	if spec.GetCreateFilesystem() && spec.GetMetadata()[volume.CreateFilesystemKey] == "false" {
		return nil, errdefs.Field(fmt.Sprintf("spec.metadata[%q]", volume.CreateFilesystemKey),
			"is \"false\" but spec.create_filesystem is true; set one of them")
	}
	if err := volume.CheckIOLimits(spec.GetIoLimits(), func(f string) string { return "spec.io_limits." + f }); err != nil {
		return nil, err
	}
	if vt == crustv1.VolumeType_VOLUME_TYPE_PMEM && proto.Size(spec.GetIoLimits()) > 0 {
		// Accepting them would promise a cap nothing enforces.
		return nil, errdefs.Field("spec.io_limits", "must be unset for VOLUME_TYPE_PMEM: the guest maps persistent "+
			"memory and reads and writes it without block requests, so there is nothing to throttle")
	}

	if err := v.TargetPath("spec.volume_target_path", spec.GetVolumeTargetPath()); err != nil {
		return nil, err
	}
	resolved, dn, err := v.Device("spec.volume_backing_path", spec.GetVolumeBackingPath(), vt)
	if err != nil {
		return nil, err
	}

	out := proto.Clone(spec).(*crustv1.VolumeSpec)
	if out.VolumeType == crustv1.VolumeType_VOLUME_TYPE_UNSPECIFIED {
		out.VolumeType = crustv1.VolumeType_VOLUME_TYPE_BLOCK
	}
	// Kata's createFilesystem key is folded into the typed field, so that handlers read one place and the
	// projection writes it back from there.
	if val, ok := out.GetMetadata()[volume.CreateFilesystemKey]; ok {
		out.CreateFilesystem = out.CreateFilesystem || val == "true"
		delete(out.Metadata, volume.CreateFilesystemKey)
		if len(out.Metadata) == 0 {
			out.Metadata = nil
		}
	}
	if out.VolumeSupplementalGroup != nil &&
		out.SupplementalGroupChangePolicy == crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_UNSPECIFIED {
		out.SupplementalGroupChangePolicy = crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS
	}
	if proto.Size(out.GetIoLimits()) == 0 { // all zero: no limit, as when unset
		out.IoLimits = nil
	}
	return &Checked{Spec: out, ResolvedBackingPath: resolved, DeviceNumber: dn}, nil
}

// PmemAlign is the alignment the size of a persistent-memory volume's backing must have: a microVM maps it
// into the guest's physical memory in 2 MiB steps (QEMU's virtio-pmem and nvdimm both refuse other sizes).
const PmemAlign = 2 << 20

// pmemSize checks that a persistent-memory backing of size bytes can be mapped into a guest: a positive
// multiple of PmemAlign.
func pmemSize(field, resolved string, size int64) error {
	if size <= 0 || size%PmemAlign != 0 {
		return errdefs.Field(field, "%q is %d bytes: a persistent-memory volume must be a positive multiple of "+
			"2 MiB (%d bytes), as a microVM maps it into guest memory in 2 MiB steps", resolved, size, PmemAlign)
	}
	return nil
}

// volumeType accepts the known volume types, and FILE only when file-backed volumes are allowed.
func (v *Validator) volumeType(field string, t crustv1.VolumeType) error {
	switch t {
	case crustv1.VolumeType_VOLUME_TYPE_UNSPECIFIED, crustv1.VolumeType_VOLUME_TYPE_BLOCK,
		crustv1.VolumeType_VOLUME_TYPE_PMEM:
		return nil
	case crustv1.VolumeType_VOLUME_TYPE_FILE:
		if !v.allowFile {
			return errdefs.Field(field, "VOLUME_TYPE_FILE is refused: crustd runs without --allow-file-backed")
		}
		return nil
	}
	return errdefs.Field(field, "%d is not a known volume type", int32(t))
}

// volumeMode accepts the known volume modes. Raw block is refused for a pmem volume: the handler attaches
// pmem as guest persistent memory so that a filesystem on it gets direct access, which a raw device
// does not use; such a device is handed over as a plain disk with volume_type VOLUME_TYPE_BLOCK.
func volumeMode(field string, m crustv1.VolumeMode, vt crustv1.VolumeType) error {
	switch m {
	case crustv1.VolumeMode_VOLUME_MODE_UNSPECIFIED, crustv1.VolumeMode_VOLUME_MODE_FILESYSTEM:
		return nil
	case crustv1.VolumeMode_VOLUME_MODE_BLOCK:
		if vt == crustv1.VolumeType_VOLUME_TYPE_PMEM {
			return errdefs.Field(field, "VOLUME_MODE_BLOCK is refused for VOLUME_TYPE_PMEM: a raw pmem device is handed "+
				"to the sandbox as a plain disk, staged with volume_type VOLUME_TYPE_BLOCK")
		}
		return nil
	}
	return errdefs.Field(field, "%d is not a known volume mode", int32(m))
}

// noFilesystem refuses, for a raw block spec, every field that describes a filesystem: the sandbox gets
// the device itself, so there is nothing to mount, format or give a group.
func noFilesystem(spec *crustv1.VolumeSpec) error {
	const why = "must be unset for volume_mode VOLUME_MODE_BLOCK: the sandbox gets the raw device, with no filesystem"
	switch {
	case spec.GetFsType() != "":
		return errdefs.Field("spec.fs_type", "%s (got %q)", why, spec.GetFsType())
	case len(spec.GetMountFlags()) > 0:
		return errdefs.Field("spec.mount_flags", "%s (got %d options; read_only is the one mode a raw volume has)", why, len(spec.GetMountFlags()))
	case spec.GetCreateFilesystem():
		return errdefs.Field("spec.create_filesystem", "%s to create", why)
	case spec.VolumeSupplementalGroup != nil:
		return errdefs.Field("spec.volume_supplemental_group", "%s to give the group (got %d)", why, spec.GetVolumeSupplementalGroup())
	case spec.GetSupplementalGroupChangePolicy() != crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_UNSPECIFIED:
		return errdefs.Field("spec.supplemental_group_change_policy", "%s", why)
	}
	return nil
}

// supplementalGroup checks volume_supplemental_group and supplemental_group_change_policy together.
func supplementalGroup(spec *crustv1.VolumeSpec) error {
	const gField, pField = "spec.volume_supplemental_group", "spec.supplemental_group_change_policy"
	if g := spec.VolumeSupplementalGroup; g != nil {
		if *g < 0 {
			return errdefs.Field(gField, "%d is negative", *g)
		}
		if *g > math.MaxInt32 {
			return errdefs.Field(gField, "%d is larger than %d", *g, math.MaxInt32)
		}
	}
	switch p := spec.GetSupplementalGroupChangePolicy(); p {
	case crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_UNSPECIFIED:
	case crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS,
		crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH:
		if spec.VolumeSupplementalGroup == nil {
			return errdefs.Field(pField, "is set but volume_supplemental_group is not")
		}
	default:
		return errdefs.Field(pField, "%d is not a known policy", int32(p))
	}
	return nil
}

// consistentPodUID refuses a pod_uid (or pod.uid metadata) that names another pod than the kubelet pod
// directory the target path lies in, so that garbage collection by pod cannot be misled.
func (v *Validator) consistentPodUID(spec *crustv1.VolumeSpec) error {
	field, uid := "spec.pod_uid", spec.GetPodUid()
	if mdUID, ok := spec.GetMetadata()[volume.PodUIDKey]; ok {
		mdField := fmt.Sprintf("spec.metadata[%q]", volume.PodUIDKey)
		if uid != "" && mdUID != uid {
			return errdefs.Field(mdField, "%q does not match pod_uid %q", mdUID, uid)
		}
		if uid == "" { // the metadata alone names a pod: it too must be the target path's
			field, uid = mdField, mdUID
		}
	}
	if uid == "" {
		return nil
	}
	if dir := volume.PodDirUID(v.root, spec.GetVolumeTargetPath()); dir != "" && dir != uid {
		return errdefs.Field(field, "%q does not match the pod directory %q of volume_target_path", uid, dir)
	}
	return nil
}
