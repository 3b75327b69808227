package client

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// Client makes CSI node calls into crust calls. It is safe for concurrent use. Create it with New.
type Client struct {
	conn    *grpc.ClientConn
	volumes crustv1.VolumeServiceClient
	info    crustv1.InfoServiceClient
	driver  string
}

// Option configures New.
type Option func(*clientOptions)

type clientOptions struct {
	driver string
	dial   []grpc.DialOption
}

// WithDriverName records the CSI driver's name in every descriptor Publish deposits (csi_driver), for
// operators. It must be a CSI plugin name.
func WithDriverName(name string) Option { return func(o *clientOptions) { o.driver = name } }

// WithDialOptions adds gRPC dial options, such as interceptors.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *clientOptions) { o.dial = append(o.dial, opts...) }
}

// New returns a client of crustd at socket (a path or a unix:// address; SocketFromEnv gives the usual
// one). It does not wait for crustd: each call does, within its context, so a driver may create its
// client before crustd is up.
func New(socket string, opts ...Option) (*Client, error) {
	var o clientOptions
	for _, opt := range opts {
		opt(&o)
	}
	conn, err := crustd.Dial(socket, o.dial...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, volumes: crustv1.NewVolumeServiceClient(conn), info: crustv1.NewInfoServiceClient(conn), driver: o.driver}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Info returns what crustd speaks: its version, the API versions and the features it serves (the
// crustd.Feature* names, such as crustd.FeatureRawBlock before depositing a raw block volume). A crustd
// older than the call answers Unimplemented, and serves none of the features.
func (c *Client) Info(ctx context.Context) (*crustv1.GetInfoResponse, error) {
	return c.info.GetInfo(ctx, &crustv1.GetInfoRequest{})
}

// Volumes returns the raw VolumeService client, for calls this package does not wrap (GetVolume,
// ListVolumes).
func (c *Client) Volumes() crustv1.VolumeServiceClient { return c.volumes }

// Publish deposits the descriptor StageRequest builds from req and device, and answers NodePublishVolume.
// It is idempotent: publishing the same target with the same parameters again succeeds, with other
// parameters it fails with AlreadyExists. When it returns nil the descriptor is durable in crustd.
//
// Publish does not touch the file system: kubelet expects the target directory to exist after
// NodePublishVolume, so the driver creates it (mode 0750) before or after the call.
func (c *Client) Publish(ctx context.Context, req *csi.NodePublishVolumeRequest, device string, opts ...PublishOption) (*csi.NodePublishVolumeResponse, error) {
	if _, err := c.Stage(ctx, req, device, opts...); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// Stage is Publish answering with the volume crustd holds, as StageVolume answers it: with its
// kata_caveats, which say what an unmodified Kata runtime will not honour of it, or that Kata will not
// find it at all (a target path too long for a Kata directory name), for a caller that tells the pod.
func (c *Client) Stage(ctx context.Context, req *csi.NodePublishVolumeRequest, device string, opts ...PublishOption) (*crustv1.Volume, error) {
	if c.driver != "" {
		opts = append([]PublishOption{DriverName(c.driver)}, opts...)
	}
	sreq, err := StageRequest(req, device, opts...)
	if err != nil {
		return nil, err
	}
	resp, err := c.volumes.StageVolume(ctx, sreq)
	if err != nil {
		return nil, err
	}
	return resp.GetVolume(), nil
}

// Unpublish removes the descriptor at req's target path and answers NodeUnpublishVolume. A target crustd
// does not hold is a success, as CSI wants a repeated NodeUnpublishVolume to be; a target crustd holds for
// another volume id is NotFound and is left alone (Stats, Health and Expand check the id the same way).
// It does not remove the target directory; the driver does (CSI: the plugin deletes what it created at
// the target path).
func (c *Client) Unpublish(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId(), "target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	if _, err := c.heldFor(ctx, req.GetTargetPath(), req.GetVolumeId()); err != nil {
		return nil, err
	}
	if _, err := c.volumes.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: req.GetTargetPath()}); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// Stats answers NodeGetVolumeStats for the deferred volume at req's volume_path with the usage (bytes and
// inodes) measured inside the sandbox that uses it (the volume's condition is Health's). Before any
// sandbox uses the volume it answers one bytes entry whose total is the device's size, used and available
// unknown (zero; kubelet reports them as zero). It fails with NotFound when crustd holds nothing at that
// path (a path crustd would refuse, such as a relative one, included) or holds it for another volume.
func (c *Client) Stats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	r, err := c.volumeStats(ctx, req.GetVolumeId(), "volume_path", req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	out := &csi.NodeGetVolumeStatsResponse{}
	for _, u := range r.GetUsage() {
		unit := csi.VolumeUsage_UNKNOWN
		switch u.GetUnit() {
		case crustv1.VolumeUsage_UNIT_BYTES:
			unit = csi.VolumeUsage_BYTES
		case crustv1.VolumeUsage_UNIT_INODES:
			unit = csi.VolumeUsage_INODES
		}
		out.Usage = append(out.Usage, &csi.VolumeUsage{
			Available: u.GetAvailable(), Total: u.GetTotal(), Used: u.GetUsed(), Unit: unit,
		})
	}
	return out, nil
}

// HealthReason is the reason of the health entry Health reports for a volume the sandbox finds abnormal.
const HealthReason = "AbnormalInSandbox"

// Health answers NodeGetVolumeHealth (alpha in CSI 1.13, which dropped the volume condition from
// NodeGetVolumeStats) for the deferred volume at req's volume_publish_path: no entry while the sandbox finds
// the volume healthy, one DEGRADED entry with reason HealthReason and the sandbox's message otherwise.
// Errors are those of Stats.
func (c *Client) Health(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	r, err := c.volumeStats(ctx, req.GetVolumeId(), "volume_publish_path", req.GetVolumePublishPath())
	if err != nil {
		return nil, err
	}
	h := &csi.VolumeHealth{VolumeId: req.GetVolumeId()}
	if vc := r.GetVolumeCondition(); vc.GetAbnormal() {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_DEGRADED, Reason: HealthReason, Message: vc.GetMessage(),
		})
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// volumeStats asks crustd for the stats of the volume volumeID at path (the request's field pathField),
// after checking that both are set (required) and that crustd holds path for that volume (mustHold).
func (c *Client) volumeStats(ctx context.Context, volumeID, pathField, path string) (*crustv1.GetVolumeStatsResponse, error) {
	if err := required("volume_id", volumeID, pathField, path); err != nil {
		return nil, err
	}
	if err := c.mustHold(ctx, path, volumeID); err != nil {
		return nil, err
	}
	return c.volumes.GetVolumeStats(ctx, &crustv1.GetVolumeStatsRequest{VolumeTargetPath: path})
}

// Expand answers NodeExpandVolume for the deferred volume at req's volume_path: the sandbox that uses it
// grows the filesystem online to at least capacity_range.required_bytes, and the response carries the
// capacity the sandbox then sees. The device must already be grown (ControllerExpandVolume). A volume
// already that large is a success. Before any sandbox uses the volume, crustd records the size and the
// response carries the device's size; the sandbox grows the filesystem when it mounts the volume. It
// fails with InvalidArgument when the request has no required_bytes (there is no size to grow to),
// NotFound when crustd holds nothing at that path (as Stats) and FailedPrecondition when the device is
// smaller than required_bytes.
func (c *Client) Expand(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId(), "volume_path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	cr := req.GetCapacityRange()
	if cr.GetRequiredBytes() <= 0 {
		return nil, errdefs.Field("capacity_range.required_bytes", "a deferred volume is grown to a size, so it must be positive")
	}
	if err := c.mustHold(ctx, req.GetVolumePath(), req.GetVolumeId()); err != nil {
		return nil, err
	}
	r, err := c.volumes.ExpandVolume(ctx, &crustv1.ExpandVolumeRequest{
		VolumeTargetPath: req.GetVolumePath(), RequiredBytes: cr.GetRequiredBytes(), LimitBytes: cr.GetLimitBytes(),
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: r.GetCapacityBytes()}, nil
}

// heldFor reports whether crustd holds a descriptor at targetPath, and fails with NotFound when it holds
// it for another volume than volumeID (a descriptor deposited without a volume id is taken as any
// volume's): a call naming one volume never acts on another's path.
func (c *Client) heldFor(ctx context.Context, targetPath, volumeID string) (bool, error) {
	r, err := c.volumes.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: targetPath})
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) {
		return false, nil // a path crustd refuses holds nothing
	}
	if err != nil {
		return false, err
	}
	if id := r.GetVolume().GetSpec().GetVolumeId(); id != "" && id != volumeID {
		return true, errdefs.Errorf(errdefs.ErrNotFound, "volume %s is not at %s (volume %s is)", volumeID, targetPath, id)
	}
	return true, nil
}

// mustHold fails with NotFound unless crustd holds targetPath for volumeID (heldFor): the CSI answer for a
// volume that is not at the path it names.
func (c *Client) mustHold(ctx context.Context, targetPath, volumeID string) error {
	held, err := c.heldFor(ctx, targetPath, volumeID)
	if err == nil && !held {
		err = errdefs.Errorf(errdefs.ErrNotFound, "volume %s is not at %s: crustd holds no deferred volume there", volumeID, targetPath)
	}
	return err
}

// Holds reports whether crustd holds a descriptor at targetPath, that is, whether the volume published
// there was deferred. Requests after NodePublishVolume carry no volume context, so a driver asks this
// before it unpublishes, measures or expands on the host. A path crustd would refuse (empty, relative,
// outside its kubelet root) is not held.
func (c *Client) Holds(ctx context.Context, targetPath string) (bool, error) {
	if targetPath == "" {
		return false, nil
	}
	_, err := c.volumes.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: targetPath})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrInvalidArgument):
		return false, nil
	}
	return false, err
}

// PublishOption adjusts the descriptor Publish and StageRequest build.
type PublishOption func(*crustv1.VolumeSpec)

// CreateFilesystem lets the runtime format the device inside the sandbox when it holds no filesystem.
// Without it a blank device fails to mount there: use it when the driver does not format volumes itself.
// It has no effect on a raw block volume (see RawBlock).
func CreateFilesystem() PublishOption {
	return func(s *crustv1.VolumeSpec) { s.CreateFilesystem = true }
}

// DefaultFSType is the filesystem type used when the mount capability names none (CSI leaves the
// default to the plugin). Without it the default is volume.DefaultFSType. It has no effect on a raw block volume.
func DefaultFSType(fsType string) PublishOption {
	return func(s *crustv1.VolumeSpec) {
		if s.FsType == "" {
			s.FsType = fsType
		}
	}
}

// VolumeType says what the device is (default VOLUME_TYPE_BLOCK; VOLUME_TYPE_FILE for a raw image file,
// which crustd accepts only with --allow-file-backed).
func VolumeType(t crustv1.VolumeType) PublishOption {
	return func(s *crustv1.VolumeSpec) { s.VolumeType = t }
}

// FSGroupChangePolicy says how the fsGroup (the capability's volume_mount_group) is applied in the
// sandbox; it has an effect only when a group is given.
func FSGroupChangePolicy(p crustv1.FSGroupChangePolicy) PublishOption {
	return func(s *crustv1.VolumeSpec) {
		if s.VolumeSupplementalGroup != nil {
			s.SupplementalGroupChangePolicy = p
		}
	}
}

// RawBlock lets Publish and StageRequest defer a volume published with a block capability
// (volumeMode: Block) as a raw block descriptor (volume_mode VOLUME_MODE_BLOCK): the runtime handler that
// claims it gives the sandbox the device itself at the guest path, with no filesystem. Without this
// option a block capability is refused, since a microVM runtime can take a raw device as kubelet hands it
// over; use it when the driver wants crust's handlers to attach the device (for their device checks,
// one-writer rule and stats). The descriptor is a record for runtime handlers only: Publish changes
// nothing on the node, so the driver still publishes the device at target_path as CSI asks of a block
// volume, for kubelet and for runtimes that know nothing of crust. With a mount capability the option
// has no effect; options that describe a filesystem (CreateFilesystem, DefaultFSType) have none on a raw
// block volume.
func RawBlock() PublishOption {
	return func(s *crustv1.VolumeSpec) { s.VolumeMode = crustv1.VolumeMode_VOLUME_MODE_BLOCK }
}

// DriverName records the CSI driver's name (csi_driver); Client sets it from WithDriverName.
func DriverName(name string) PublishOption {
	return func(s *crustv1.VolumeSpec) { s.CsiDriver = name }
}

// Metadata adds pairs for the runtime handler; keys must be on crustd's allow-list. The pod information
// StageRequest takes from the volume context is added without it.
func Metadata(md map[string]string) PublishOption {
	return func(s *crustv1.VolumeSpec) {
		for k, v := range md {
			if s.Metadata == nil {
				s.Metadata = map[string]string{}
			}
			s.Metadata[k] = v
		}
	}
}

// StageRequest builds the StageVolumeRequest that defers req's volume, on device, to the runtime:
//
//   - volume_target_path is req's target_path, volume_backing_path is device, volume_id is req's;
//   - fs_type is the mount capability's (else the DefaultFSType option's, else volume.DefaultFSType);
//   - mount_flags are the capability's, split at commas, trimmed, without empties and repeats; a "ro" flag
//     becomes read_only (crust carries it in the typed field) and a "rw" flag is dropped unless req is
//     read-only, which crustd then refuses as a contradiction;
//   - read_only is true when req is read-only (ReadOnly: its readonly, or a reader-only access mode) or
//     has a "ro" flag;
//   - volume_supplemental_group is the capability's volume_mount_group (the pod's fsGroup, sent by kubelet
//     when the driver has the VOLUME_MOUNT_GROUP node capability);
//   - pod_uid and metadata come from the pod information in the volume context (PodInfo); without a pod
//     UID there, pod_uid is the one in a target path of kubelet's shape (volume.ParseTargetPath);
//   - io_limits come from the I/O limit keys of the volume context (volume.ParseIOLimits), unset when
//     there are none;
//   - a volume context that asks for encryption (volume.ParseEncryption) adds the key from req's secrets
//     (volume.EncryptionKeyFrom) as the metadata encryptionKey, which crustd keeps secret, and
//     crust.dev/encryption-integrity "true" when integrity is asked.
//
// The CSI proxy builds its descriptors with this function too, from the same request (with the
// StorageClass's crust keys added to the volume context when the driver did not echo them), so that a
// volume is described the same whether its driver calls crustd itself or sits behind the proxy.
//
// Options apply in order after that. A block capability makes a raw block descriptor when the RawBlock
// option is given: volume_mode VOLUME_MODE_BLOCK, read_only as above, pod information, I/O limits and the
// options' fields, and no fs_type, mount_flags, group or create_filesystem.
//
// It fails with InvalidArgument, naming the CSI field, when req has no volume_id, target_path or
// volume_capability, when the capability is neither a mount nor a block one, when it is a block one and
// RawBlock is not given (a raw block volume is used by the sandbox as a device and needs no deferral),
// when the group is not a number, or when device is empty; and naming the key when an I/O limit is not a
// whole, non-negative quantity or the limits cannot go together (volume.CheckIOLimits), when the
// encryption keys are malformed or the key is missing, and when a raw block volume asks for encryption.
func StageRequest(req *csi.NodePublishVolumeRequest, device string, opts ...PublishOption) (*crustv1.StageVolumeRequest, error) {
	if err := required("volume_id", req.GetVolumeId(), "target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	vc := req.GetVolumeCapability()
	if vc == nil {
		return nil, errdefs.Field("volume_capability", "is required")
	}
	mnt := vc.GetMount()
	if mnt == nil && vc.GetBlock() == nil {
		return nil, errdefs.Field("volume_capability", "has neither a mount nor a block access type")
	}
	if device == "" {
		return nil, errdefs.Field("device", "is required (the block device to defer)")
	}
	spec := &crustv1.VolumeSpec{
		VolumeTargetPath:  req.GetTargetPath(),
		VolumeBackingPath: device,
		VolumeType:        crustv1.VolumeType_VOLUME_TYPE_BLOCK,
		ReadOnly:          ReadOnly(req),
		VolumeId:          req.GetVolumeId(),
	}
	pod := PodInfo(req.GetVolumeContext())
	spec.PodUid = pod.UID
	if t, ok := volume.ParseTargetPath(req.GetTargetPath()); ok && spec.PodUid == "" {
		spec.PodUid = t.PodUID
	}
	if md := pod.Metadata(); len(md) > 0 {
		spec.Metadata = md
	}
	limits, err := volume.ParseIOLimits(req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	spec.IoLimits = limits
	if err := encryptionFields(spec, req); err != nil {
		return nil, err
	}
	if mnt != nil {
		if err := mountFields(spec, mnt); err != nil {
			return nil, err
		}
	}
	for _, opt := range opts {
		opt(spec)
	}
	switch {
	case mnt != nil:
		spec.VolumeMode = crustv1.VolumeMode_VOLUME_MODE_UNSPECIFIED // RawBlock is for block capabilities only
		if spec.FsType == "" {
			spec.FsType = volume.DefaultFSType
		}
	case spec.VolumeMode != crustv1.VolumeMode_VOLUME_MODE_BLOCK:
		return nil, errdefs.Field("volume_capability", "a block volume is deferred only with the "+
			"RawBlock option; without it, publish it on the host: the runtime hands the device to the sandbox itself")
	case spec.GetMetadata()[volume.EncryptionKey] != "":
		return nil, errdefs.Field(volume.EncryptionParamKey, "a raw block volume is not encrypted by crust: the sandbox gets the device itself")
	default:
		spec.FsType, spec.CreateFilesystem = "", false // filesystem options mean nothing for a raw device
	}
	return &crustv1.StageVolumeRequest{Spec: spec}, nil
}

// encryptionFields adds the encryption req's volume context asks for to spec's metadata: the key from
// req's secrets, and integrity.
func encryptionFields(spec *crustv1.VolumeSpec, req *csi.NodePublishVolumeRequest) error {
	enc, err := volume.ParseEncryption(req.GetVolumeContext())
	if err != nil || enc == nil {
		return err
	}
	key, err := volume.EncryptionKeyFrom(req.GetSecrets())
	if err != nil {
		return err
	}
	if spec.Metadata == nil {
		spec.Metadata = map[string]string{}
	}
	spec.Metadata[volume.EncryptionKey] = key
	if enc.Integrity {
		spec.Metadata[volume.EncryptionIntegrityKey] = "true"
	}
	return nil
}

// ReadOnly reports whether a publish is read-only: req says so, or its access mode is a reader-only one.
func ReadOnly(req *csi.NodePublishVolumeRequest) bool {
	switch req.GetVolumeCapability().GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return true
	}
	return req.GetReadonly()
}

// mountFields sets what a mount capability says: fs type, mount flags (and read-only from a "ro" flag)
// and the group.
func mountFields(spec *crustv1.VolumeSpec, mnt *csi.VolumeCapability_MountVolume) error {
	spec.FsType = mnt.GetFsType()
	seen := map[string]bool{}
	for _, f := range mnt.GetMountFlags() {
		for _, one := range strings.Split(f, ",") {
			one = strings.TrimSpace(one)
			if one == "" || seen[one] {
				continue
			}
			seen[one] = true
			spec.MountFlags = append(spec.MountFlags, one)
		}
	}
	if seen["ro"] {
		spec.ReadOnly = true
	}
	flags := spec.MountFlags[:0]
	for _, f := range spec.MountFlags {
		if f == "ro" || (f == "rw" && !spec.ReadOnly) {
			continue
		}
		flags = append(flags, f)
	}
	spec.MountFlags = flags
	if g := mnt.GetVolumeMountGroup(); g != "" {
		gid, err := strconv.ParseInt(g, 10, 64)
		if err != nil {
			return errdefs.Field("volume_capability.mount.volume_mount_group", "%q is not a group id", g)
		}
		spec.VolumeSupplementalGroup = &gid
	}
	return nil
}

// required fails with InvalidArgument naming the first empty field of the name, value pairs.
func required(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return errdefs.Field(pairs[i], "is required")
		}
	}
	return nil
}

// HoldForNode records with crustd, before the caller formats or mounts device at target on the node (for
// pod, whose runtime shares the node's kernel), that the node holds the device: until ReleaseFromNode, a
// sandbox's deposit or claim of the device, under any of its names, is refused. The hold itself is
// refused (errdefs.ErrFailedPrecondition, naming the holder's pod and runtime) while a sandbox holds the
// device and either side writes. The node's holds never refuse each other. A crustd without
// crustd.FeatureNodeHolds answers errdefs.ErrUnimplemented.
func (c *Client) HoldForNode(ctx context.Context, target, device string, readOnly bool, pod Pod) error {
	_, err := c.volumes.HoldForNode(ctx, &crustv1.HoldForNodeRequest{Hold: &crustv1.NodeHold{
		VolumeTargetPath: target, DevicePath: device, ReadOnly: readOnly,
		PodNamespace: pod.Namespace, PodName: pod.Name, PodUid: pod.UID,
	}})
	return err
}

// ReleaseFromNode ends the node's hold at target, once the device is unmounted there; a target without
// one is not an error.
func (c *Client) ReleaseFromNode(ctx context.Context, target string) error {
	_, err := c.volumes.ReleaseFromNode(ctx, &crustv1.ReleaseFromNodeRequest{VolumeTargetPath: target})
	return err
}
