package validate

import (
	"errors"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// Volume checks spec as Spec does and returns the descriptor it makes, without its stage time: the
// normalised spec with the resolved backing path and the device number filled in.
func (v *Validator) Volume(spec *crustv1.VolumeSpec) (*crustv1.Volume, error) {
	c, err := v.Spec(spec)
	if err != nil {
		return nil, err
	}
	return &crustv1.Volume{Spec: c.Spec, ResolvedBackingPath: c.ResolvedBackingPath, DeviceNumber: c.DeviceNumber}, nil
}

// SandboxID is the package's SandboxID, as a method, so that a *Validator checks every field of a
// request.
func (*Validator) SandboxID(field, id string) error { return SandboxID(field, id) }

// HandlerEndpoint is the package's HandlerEndpoint, as a method, so that a *Validator checks every field
// of a request.
func (*Validator) HandlerEndpoint(field, ep string) error { return HandlerEndpoint(field, ep) }

// maxPodNameLen bounds a pod's namespace and name: Kubernetes' DNS subdomain limit.
const maxPodNameLen = 253

// NodeHold checks a hold of the node's on a device (crustv1.NodeHold) and returns the record that keeps
// it: a Volume whose spec carries the target path, the device as backing path, VOLUME_TYPE_BLOCK and
// read_only, with the resolved device, its number and the hold. The target path is checked as a
// deposit's, the device as a deposit's block device (Device); the pod's namespace and name are printable
// and at most 253 bytes, its UID a UID. A refusal is a *errdefs.FieldError naming the field under "hold.".
func (v *Validator) NodeHold(h *crustv1.NodeHold) (*crustv1.Volume, error) {
	if h == nil {
		return nil, errdefs.Field("hold", "is required")
	}
	if err := errors.Join(
		maxLen("hold.pod_namespace", h.GetPodNamespace(), maxPodNameLen), printable("hold.pod_namespace", h.GetPodNamespace()),
		maxLen("hold.pod_name", h.GetPodName(), maxPodNameLen), printable("hold.pod_name", h.GetPodName()),
		podUID("hold.pod_uid", h.GetPodUid()),
	); err != nil {
		return nil, err
	}
	if err := v.TargetPath("hold.volume_target_path", h.GetVolumeTargetPath()); err != nil {
		return nil, err
	}
	block := crustv1.VolumeType_VOLUME_TYPE_BLOCK
	resolved, dn, err := v.Device("hold.device_path", h.GetDevicePath(), block)
	if err != nil {
		return nil, err
	}
	return &crustv1.Volume{
		Spec: &crustv1.VolumeSpec{VolumeTargetPath: h.GetVolumeTargetPath(), VolumeBackingPath: h.GetDevicePath(),
			VolumeType: block, ReadOnly: h.GetReadOnly()},
		ResolvedBackingPath: resolved, DeviceNumber: dn, NodeHold: proto.CloneOf(h),
	}, nil
}
