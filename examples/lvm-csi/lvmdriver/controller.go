package lvmdriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"crust.dev/crust/examples/lvm-csi/internal/lvm"
)

// volumeTag marks the logical volumes the driver made; it never touches others.
const volumeTag = "crust-csi"

// filesystemTag marks a volume created with mount capabilities only (see Config.StrictAccessType).
const filesystemTag = "crust-csi-fs"

// VolumeID returns the volume id, which is the logical volume's name, of the volume CreateVolume makes
// for a CSI name: "csi-" and 40 hex digits of the name's SHA-256, so that any CSI name (up to 128 bytes
// of any UTF-8) gives a valid LVM name and the same name always gives the same volume.
func VolumeID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "csi-" + hex.EncodeToString(sum[:20])
}

var volumeIDRE = regexp.MustCompile(`^csi-[0-9a-f]{40}$`)

// --- Identity ---

// GetPluginInfo returns the plugin's name and version.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.cfg.Name, VendorVersion: Version}, nil
}

// GetPluginCapabilities says the plugin has a controller service and expands volumes online, and with
// Config.Capacity that its volumes have accessibility constraints (the node).
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
			Type: csi.PluginCapability_VolumeExpansion_ONLINE}}},
	}
	if d.cfg.Capacity {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is ready while the volume group answers; FailedPrecondition otherwise.
func (d *Driver) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if _, err := d.lvm.VG(ctx, d.cfg.VG); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume group %s: %v", d.cfg.VG, err)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// --- Controller ---

// ControllerGetCapabilities returns CREATE_DELETE_VOLUME and EXPAND_VOLUME, and GET_CAPACITY with
// Config.Capacity.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	}
	if d.cfg.Capacity {
		types = append(types, csi.ControllerServiceCapability_RPC_GET_CAPACITY)
	}
	for _, c := range types {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume makes a linear logical volume for req.name, or returns the one made earlier for it when its
// capacity fits req's range (AlreadyExists when it does not).
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := firstError(required("name", req.GetName()), requiredCapabilities(req.GetVolumeCapabilities())); err != nil {
		return nil, err
	}
	for i, c := range req.GetVolumeCapabilities() {
		if err := checkCapability(fmt.Sprintf("volume_capabilities[%d]", i), c); err != nil {
			return nil, err
		}
	}
	if req.GetVolumeContentSource() != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "volume_content_source: snapshots and clones are not supported")
	}
	volCtx, err := checkParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	if d.cfg.NoVolumeContext {
		volCtx = nil
	}
	cr := req.GetCapacityRange()
	if err := checkRange("capacity_range", cr); err != nil {
		return nil, err
	}

	d.ctrlMu.Lock()
	defer d.ctrlMu.Unlock()
	vg, err := d.lvm.VG(ctx, d.cfg.VG)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "volume group: %v", err)
	}
	id := VolumeID(req.GetName())
	if lv, err := d.lvm.LV(ctx, d.cfg.VG, id); err == nil {
		if !lv.HasTag(volumeTag) {
			return nil, errdefs.Errorf(errdefs.ErrAlreadyExists, "logical volume %s exists and was not made by this driver", id)
		}
		if !fits(lv.Size, cr) {
			return nil, errdefs.Errorf(errdefs.ErrAlreadyExists,
				"volume %q exists with %d bytes, outside the requested range [%d, %d]",
				req.GetName(), lv.Size, cr.GetRequiredBytes(), cr.GetLimitBytes())
		}
		if _, err := d.act.activate(ctx, lv, false); err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInternal, "activate %s: %v", id, err)
		}
		return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: lv.Size, VolumeContext: volCtx,
			AccessibleTopology: d.topology()}}, nil
	} else if !errors.Is(err, lvm.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "look up %s: %v", id, err)
	}

	want := cr.GetRequiredBytes()
	if want == 0 {
		want = d.cfg.DefaultCapacity
		if l := cr.GetLimitBytes(); l > 0 && l < want {
			want = l
		}
	}
	size := roundUp(want, vg.ExtentSize)
	if l := cr.GetLimitBytes(); l > 0 && size > l {
		return nil, errdefs.Errorf(errdefs.ErrOutOfRange,
			"capacity_range: volumes are whole extents of %d bytes; none lies in [%d, %d]", vg.ExtentSize, cr.GetRequiredBytes(), l)
	}
	if size > vg.Free {
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "volume group %s has %d bytes free, %d asked", d.cfg.VG, vg.Free, size)
	}
	args := []string{"--yes", "--type", "linear", "--size", strconv.FormatInt(size, 10) + "b", "--name", id, "--addtag", volumeTag}
	if !slices.ContainsFunc(req.GetVolumeCapabilities(), func(c *csi.VolumeCapability) bool { return c.GetBlock() != nil }) {
		args = append(args, "--addtag", filesystemTag)
	}
	if d.cfg.Activation == ActivationExtentMap {
		args = append(args, "--activate", "n", "--zero", "n", "--wipesignatures", "n")
	} else {
		args = append(args, "--zero", "y", "--wipesignatures", "y")
	}
	if _, err := d.lvm.Run(ctx, "lvcreate", append(args, "--", d.cfg.VG)...); err != nil {
		if errors.Is(err, lvm.ErrNoSpace) {
			return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "%v", err)
		}
		return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
	}
	lv, err := d.lvm.LV(ctx, d.cfg.VG, id)
	if err == nil {
		_, err = d.act.activate(ctx, lv, true)
	}
	if err != nil {
		_ = d.act.deactivate(ctx, id)
		_, _ = d.lvm.Run(ctx, "lvremove", "--yes", "--", d.cfg.VG+"/"+id)
		return nil, errdefs.Errorf(errdefs.ErrInternal, "activate %s: %v", id, err)
	}
	d.log.Info("volume created", "name", req.GetName(), "volume_id", id, "bytes", lv.Size)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: lv.Size, VolumeContext: volCtx,
		AccessibleTopology: d.topology()}}, nil
}

// DeleteVolume removes the volume. An unknown volume is a success; a volume in use (mounted or open) is
// FailedPrecondition.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := required("volume_id", id); err != nil {
		return nil, err
	}
	d.ctrlMu.Lock()
	defer d.ctrlMu.Unlock()
	if _, err := d.lookup(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
		return &csi.DeleteVolumeResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	if err := d.act.deactivate(ctx, id); errors.Is(err, errInUse) {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is in use: %v", id, err)
	} else if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "deactivate %s: %v", id, err)
	}
	if _, err := d.lvm.Run(ctx, "lvremove", "--yes", "--", d.cfg.VG+"/"+id); err != nil {
		if errors.Is(err, lvm.ErrInUse) {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume %s is in use: %v", id, err)
		}
		return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
	}
	d.log.Info("volume deleted", "volume_id", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerExpandVolume grows the volume to at least required_bytes (whole extents, at most
// limit_bytes), online. A volume already that large is left as it is. Node expansion is required for a
// mount volume (and when the capability is not given), not for a block volume.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := required("volume_id", id); err != nil {
		return nil, err
	}
	cr := req.GetCapacityRange()
	if cr == nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "capacity_range: is required")
	}
	if err := checkRange("capacity_range", cr); err != nil {
		return nil, err
	}
	if err := checkOptionalCapability("volume_capability", req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	nodeExpansion := req.GetVolumeCapability().GetBlock() == nil

	d.ctrlMu.Lock()
	defer d.ctrlMu.Unlock()
	lv, err := d.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if lv.Size >= cr.GetRequiredBytes() {
		if l := cr.GetLimitBytes(); l > 0 && lv.Size > l {
			return nil, errdefs.Errorf(errdefs.ErrOutOfRange, "capacity_range: volume %s already has %d bytes, more than limit_bytes %d (volumes do not shrink)", id, lv.Size, l)
		}
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: lv.Size, NodeExpansionRequired: nodeExpansion}, nil
	}
	vg, err := d.lvm.VG(ctx, d.cfg.VG)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "volume group: %v", err)
	}
	size := roundUp(cr.GetRequiredBytes(), vg.ExtentSize)
	if l := cr.GetLimitBytes(); l > 0 && size > l {
		return nil, errdefs.Errorf(errdefs.ErrOutOfRange,
			"capacity_range: volumes are whole extents of %d bytes; none lies in [%d, %d]", vg.ExtentSize, cr.GetRequiredBytes(), l)
	}
	if size-lv.Size > vg.Free {
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "volume group %s has %d bytes free, %d more asked", d.cfg.VG, vg.Free, size-lv.Size)
	}
	if _, err := d.lvm.Run(ctx, "lvextend", "--size", strconv.FormatInt(size, 10)+"b", "--", d.cfg.VG+"/"+id); err != nil {
		if errors.Is(err, lvm.ErrNoSpace) {
			return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "%v", err)
		}
		return nil, errdefs.Errorf(errdefs.ErrInternal, "%v", err)
	}
	if lv, err = d.lvm.LV(ctx, d.cfg.VG, id); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "look up %s: %v", id, err)
	}
	if err := d.act.refresh(ctx, lv); err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "refresh %s: %v", id, err)
	}
	d.log.Info("volume expanded", "volume_id", id, "bytes", lv.Size)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: lv.Size, NodeExpansionRequired: nodeExpansion}, nil
}

// ValidateVolumeCapabilities confirms the capabilities when every one is supported, and says which is not
// otherwise.
func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := firstError(required("volume_id", req.GetVolumeId()), requiredCapabilities(req.GetVolumeCapabilities())); err != nil {
		return nil, err
	}
	for i, c := range req.GetVolumeCapabilities() {
		if c.GetAccessMode() == nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "volume_capabilities[%d].access_mode: is required", i)
		}
		if c.GetMount() == nil && c.GetBlock() == nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "volume_capabilities[%d].access_type: is required", i)
		}
	}
	if _, err := d.lookup(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	if _, err := checkParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	for i, c := range req.GetVolumeCapabilities() {
		if err := checkCapability(fmt.Sprintf("volume_capabilities[%d]", i), c); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters(),
	}}, nil
}

// lookup returns the driver's logical volume with that id, or NotFound (for an id that is not one of the
// driver's names too).
func (d *Driver) lookup(ctx context.Context, id string) (*lvm.LV, error) {
	if !volumeIDRE.MatchString(id) {
		// An inline ephemeral volume goes by kubelet's id; its logical volume by the id derived from it.
		if lv, err := d.lvm.LV(ctx, d.cfg.VG, VolumeID(id)); err == nil && lv.HasTag(ephemeralTag) {
			return lv, nil
		}
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume %q does not exist (ids are csi-<40 hex digits>)", id)
	}
	lv, err := d.lvm.LV(ctx, d.cfg.VG, id)
	if errors.Is(err, lvm.ErrNotFound) || (err == nil && !lv.HasTag(volumeTag)) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "volume %q does not exist", id)
	}
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInternal, "look up %s: %v", id, err)
	}
	return lv, nil
}

// checkCapability refuses (InvalidArgument, naming field) a capability without access mode or type, a
// multi-node access mode (the volumes are local), and a filesystem other than ext4, ext3 and xfs.
func checkCapability(field string, c *csi.VolumeCapability) error {
	if c == nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: is required", field)
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s.access_mode: is required", field)
	default:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s.access_mode: %s is not supported; volumes are local to one node",
			field, c.GetAccessMode().GetMode())
	}
	switch {
	case c.GetBlock() != nil:
	case c.GetMount() != nil:
		if t := c.GetMount().GetFsType(); t != "" && !volume.IsFormattedFSType(t) {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s.mount.fs_type: %q is not one of %s", field, t,
				strings.Join(volume.FormattedFSTypes(), ", "))
		}
	default:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s.access_type: is required (mount or block)", field)
	}
	return nil
}

// requiredCapabilities refuses (InvalidArgument) a request that lists no volume_capabilities.
func requiredCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "volume_capabilities: at least one is required")
	}
	return nil
}

// checkOptionalCapability is checkCapability for a capability the request may leave out: nil passes.
func checkOptionalCapability(field string, c *csi.VolumeCapability) error {
	if c == nil {
		return nil
	}
	return checkCapability(field, c)
}

// checkParameters accepts crust.dev/defer (a boolean), crust's I/O limit keys (quantities,
// volume.ParseIOLimits) and encryption keys (volume.ParseEncryption), and the csi.storage.k8s.io/ keys
// provisioners add, and returns the volume context to hand to the node: crust's keys that are given.
func checkParameters(params map[string]string) (map[string]string, error) {
	volCtx := map[string]string{}
	for k, v := range params {
		switch {
		case k == volume.DeferKey:
			if _, err := strconv.ParseBool(strings.TrimSpace(v)); err != nil {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "parameters[%q]: %q is not true or false", k, v)
			}
			volCtx[k] = v
		case volume.IsParameterKey(k):
			volCtx[k] = v
		case strings.HasPrefix(k, "csi.storage.k8s.io/"):
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "parameters[%q]: unknown parameter (known: %s, %s, %s, %s)", k, volume.DeferKey,
				strings.Join(volume.IOLimitKeys(), ", "), volume.EncryptionParamKey, volume.EncryptionIntegrityKey)
		}
	}
	for _, check := range []func(map[string]string) error{
		func(m map[string]string) error { _, err := volume.ParseIOLimits(m); return err },
		func(m map[string]string) error { _, err := volume.ParseEncryption(m); return err },
	} {
		var fe *errdefs.FieldError
		if err := check(volCtx); errors.As(err, &fe) {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "parameters[%q]: %s", fe.Field, fe.Reason)
		}
	}
	if len(volCtx) == 0 {
		return nil, nil
	}
	return volCtx, nil
}

// checkRange refuses negative sizes and a limit below the requirement.
func checkRange(field string, cr *csi.CapacityRange) error {
	r, l := cr.GetRequiredBytes(), cr.GetLimitBytes()
	switch {
	case r < 0 || l < 0:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: sizes must not be negative (required %d, limit %d)", field, r, l)
	case l > 0 && l < r:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s: limit_bytes %d is less than required_bytes %d", field, l, r)
	}
	return nil
}

// fits reports whether a volume of size bytes satisfies the range.
func fits(size int64, cr *csi.CapacityRange) bool {
	return size >= cr.GetRequiredBytes() && (cr.GetLimitBytes() == 0 || size <= cr.GetLimitBytes())
}

func roundUp(n, unit int64) int64 {
	if n <= 0 {
		return unit
	}
	return (n + unit - 1) / unit * unit
}
