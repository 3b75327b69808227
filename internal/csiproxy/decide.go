package csiproxy

import (
	"context"
	"time"

	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/client"
)

// Volume context keys the proxy reads.
const (
	// DeferKey in a volume context (from the StorageClass, through the driver's CreateVolume) asks for
	// deferral; a true value (strconv.ParseBool: "true", "True", "1", ...) turns it on.
	DeferKey = volume.DeferKey

	podNameKey      = volume.PodNameKey
	podNamespaceKey = volume.PodNamespaceKey
	podUIDKey       = volume.PodUIDKey
)

// Pod is what the proxy needs to know of a pod.
type Pod struct {
	Namespace, Name, UID string
	RuntimeClassName     string
	// FSGroupChangePolicy is the pod's securityContext.fsGroupChangePolicy ("" when unset).
	FSGroupChangePolicy string
	// Phase is the pod's status.phase, such as "Running" ("" when unknown).
	Phase string
	// SubPath is whether a container or init container of the pod mounts a volume with subPath or
	// subPathExpr: kubelet then makes directories in the volume's target path on the node.
	SubPath bool
}

// PodSource answers pod and RuntimeClass look-ups from a cache. Pod and PodByUID report found=false for
// a pod it does not hold; RuntimeHandler reports found=false for a RuntimeClass it does not hold.
type PodSource interface {
	Pod(namespace, name string) (p Pod, found bool)
	PodByUID(uid string) (p Pod, found bool)
	RuntimeHandler(runtimeClass string) (handler string, found bool)
}

// DeferRequested reports whether a volume context asks for deferral (volume.Deferred).
func DeferRequested(volumeContext map[string]string) bool { return volume.Deferred(volumeContext) }

// isMount reports whether a capability is a mount (filesystem) capability.
func isMount(c *csi.VolumeCapability) bool { return c.GetMount() != nil }

// DecideInput is what Decide looks at.
type DecideInput struct {
	Capability    *csi.VolumeCapability
	VolumeContext map[string]string
	// StagingPath is the request's staging path; StagedAsBlock whether the proxy staged it as raw block.
	StagingPath   string
	StagedAsBlock bool
	// Deferral decides per pod, from the pods of --kubeconfig and the handlers of --microvm-handlers.
	Deferral client.Deferral
}

// Decide applies the deferral rules of the package documentation: a volume the proxy did not stage as
// raw block passes through; otherwise in.Deferral decides (its error wraps client.ErrPodNotSeen).
func Decide(ctx context.Context, in DecideInput) (client.Decision, string, error) {
	if in.StagingPath != "" && !in.StagedAsBlock && isMount(in.Capability) && DeferRequested(in.VolumeContext) {
		return client.PassThrough, "staging path was not staged as raw block by the proxy", nil
	}
	return in.Deferral.Decide(ctx, in.Capability, in.VolumeContext)
}

// podRuntimes answers client.PodRuntimes from a PodSource.
type podRuntimes struct{ src PodSource }

// RuntimeHandler implements client.PodRuntimes: a RuntimeClass the cache does not hold is its own handler.
func (r podRuntimes) RuntimeHandler(pod client.Pod) (string, bool) {
	p, ok := r.src.Pod(pod.Namespace, pod.Name)
	if !ok || (pod.UID != "" && p.UID != "" && pod.UID != p.UID) {
		return "", false
	}
	if p.RuntimeClassName == "" {
		return "", true
	}
	if h, ok := r.src.RuntimeHandler(p.RuntimeClassName); ok {
		return h, true
	}
	return p.RuntimeClassName, true
}

// deferral is the client.Deferral of pods (nil: no look-ups), handlers and the node's default handler.
func deferral(pods PodSource, handlers client.Handlers, defaultHandler string, wait time.Duration) client.Deferral {
	d := client.Deferral{Handlers: handlers, DefaultHandler: defaultHandler, PodWait: wait}
	if pods != nil {
		d.Pods = podRuntimes{pods}
	}
	return d
}
