package validate

import crustv1 "crust.dev/crust/api/crust/v1"

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
