package csiproxy

import (
	"context"
	"fmt"
	"maps"

	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// controllerServer is the Controller service of a proxy run with --controller, in front of the driver's
// controller socket (the one external-provisioner and external-resizer dial). Provisioners copy into
// the PersistentVolume only the volume context the driver returns, never the StorageClass's parameters,
// so the node never learns that a volume must be deferred unless the controller side says so:
//
//   - CreateVolume whose parameters hold crust.dev/defer with a true value and whose capabilities are all
//     mount capabilities (a Filesystem PVC) is asked of the driver with each capability's access type
//     rewritten to Block (same access modes), so that the driver makes a volume it will publish as a raw
//     device; the response's volume context gains crust.dev/defer: "true", which the provisioner writes
//     into the PersistentVolume and kubelet hands to the node proxy.
//   - Such a request whose access mode lets several nodes write (MULTI_NODE_MULTI_WRITER or
//     MULTI_NODE_SINGLE_WRITER: a ReadWriteMany PVC) is refused with InvalidArgument naming the mode and
//     what to use instead (checkAccessMode), before the driver is asked anything.
//   - A request with a block capability (a raw block PVC) keeps its capabilities and volume context: raw
//     block volumes are never deferred.
//   - crust.dev/defer is crust's, not the driver's: it is removed from the parameters the driver sees, so
//     a driver that refuses parameters it does not know still serves a deferring class.
//   - crust's I/O limit keys (volume.IOLimitKeys) and encryption keys (crust.dev/encryption,
//     crust.dev/encryption-integrity) are checked as crustd and the descriptor will check them, and a bad
//     value, or encryption asked for a raw block volume, is refused with InvalidArgument naming the
//     parameter before the driver is asked anything; they too are removed from the driver's parameters,
//     and copied as given into the response's volume context, whence the node proxy carries them into the
//     descriptor (the key itself comes with NodePublishVolume's secrets).
//
// Every other Controller call, and anything else the driver serves on that socket, is forwarded raw.
type controllerServer struct {
	csi.UnimplementedControllerServer
	ctrl csi.ControllerClient
}

// CreateVolume asks the driver for a block volume when a deferring class asks for a filesystem, and
// marks the volume deferred in its context (see controllerServer).
func (s *controllerServer) CreateVolume(ctx context.Context, r *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	ours := map[string]string{} // crust's parameters, for the volume context
	for k, v := range r.GetParameters() {
		if volume.IsParameterKey(k) {
			ours[k] = v
		}
	}
	if len(ours) == 0 {
		return s.ctrl.CreateVolume(outgoing(ctx), r)
	}
	if err := checkParameters(ours, r.GetVolumeCapabilities()...); err != nil {
		return nil, err
	}
	deferred := DeferRequested(r.GetParameters())
	delete(ours, volume.DeferKey)
	br := proto.Clone(r).(*csi.CreateVolumeRequest)
	br.Parameters = maps.Clone(r.GetParameters())
	maps.DeleteFunc(br.Parameters, func(k, _ string) bool { return volume.IsParameterKey(k) })
	if deferred = deferred && allMount(r.GetVolumeCapabilities()); deferred {
		for i, c := range r.GetVolumeCapabilities() {
			if err := checkAccessMode(fmt.Sprintf("volume_capabilities[%d]", i), c); err != nil {
				return nil, err
			}
		}
		br.VolumeCapabilities = nil
		seen := map[csi.VolumeCapability_AccessMode_Mode]bool{}
		for _, c := range r.GetVolumeCapabilities() {
			if m := c.GetAccessMode().GetMode(); !seen[m] {
				seen[m] = true
				br.VolumeCapabilities = append(br.VolumeCapabilities, blockCapability(c))
			}
		}
	}
	resp, err := s.ctrl.CreateVolume(outgoing(ctx), br)
	if err != nil || resp.GetVolume() == nil || (!deferred && len(ours) == 0) {
		return resp, err
	}
	if resp.Volume.VolumeContext == nil {
		resp.Volume.VolumeContext = map[string]string{}
	}
	maps.Copy(resp.Volume.VolumeContext, ours)
	if deferred {
		resp.Volume.VolumeContext[volume.DeferKey] = "true"
	}
	return resp, nil
}

// allMount reports whether there are capabilities and each is a mount capability.
func allMount(cs []*csi.VolumeCapability) bool {
	for _, c := range cs {
		if !isMount(c) {
			return false
		}
	}
	return len(cs) > 0
}

// controllerServiceDesc is csi.v1.Controller with CreateVolume alone; the server hands every other
// method of the service to the raw forwarder.
func controllerServiceDesc() *grpc.ServiceDesc {
	d := csi.Controller_ServiceDesc
	d.Methods, d.Streams = nil, nil
	for _, m := range csi.Controller_ServiceDesc.Methods {
		if m.MethodName == "CreateVolume" {
			d.Methods = append(d.Methods, m)
		}
	}
	return &d
}
