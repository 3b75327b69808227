package client

import (
	"context"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"
)

// Decision is what a node plugin does with a NodePublishVolume.
type Decision int

// Decisions.
const (
	// PassThrough: publish as the driver does without crust (the volume does not ask for deferral, or is
	// raw block).
	PassThrough Decision = iota
	// Defer: deposit the device with crustd (Client.Publish); the pod's microVM runtime mounts it.
	Defer
	// HostMount: the volume asks for deferral but its pod runs on the host (runc), so the node plugin
	// formats a blank device and mounts it at the target itself, since its NodeStageVolume skipped that.
	HostMount
)

// String is the decision's name in logs and metrics: "pass-through", "defer" or "host-mount".
func (d Decision) String() string {
	switch d {
	case Defer:
		return "defer"
	case HostMount:
		return "host-mount"
	default:
		return "pass-through"
	}
}

// ReasonRawBlock is why a raw block volume (volumeMode: Block) is passed through, whatever its pod.
const ReasonRawBlock = "raw block volume (volumeMode: Block): never deferred; a microVM runtime hands the device to the sandbox itself"

// Handlers are patterns naming the microVM runtime handlers: a pod whose RuntimeClass handler matches one
// of them (path.Match: "kata" matches kata alone, "kata-*" every handler that starts with "kata-") runs in
// a microVM. Make them with ParseHandlers.
type Handlers []string

// ParseHandlers checks each pattern's syntax and returns the non-empty ones; a malformed pattern is an
// error naming it.
func ParseHandlers(patterns []string) (Handlers, error) {
	var h Handlers
	for _, p := range patterns {
		if p == "" {
			continue
		}
		// path.Match checks the whole pattern, whatever the name, before it answers false.
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("pattern %q: %w (patterns use path.Match syntax: *, ?, [a-z])", p, err)
		}
		h = append(h, p)
	}
	return h, nil
}

// Match returns the first pattern that matches handler.
func (h Handlers) Match(handler string) (pattern string, ok bool) {
	for _, p := range h {
		if m, _ := path.Match(p, handler); m {
			return p, true
		}
	}
	return "", false
}

// PodRuntimes tells which runtime handler runs a pod; a driver backs it with its pod and RuntimeClass
// informers (docs/driver-authors.md shows one).
type PodRuntimes interface {
	// RuntimeHandler returns the runtime handler of pod, found by namespace and name: "" when the pod
	// names no RuntimeClass; the handler of its RuntimeClass, or the class's name when that class is not
	// known. found is false when no such pod is known (yet), or the one known has another UID than
	// pod.UID (when both are set).
	RuntimeHandler(pod Pod) (handler string, found bool)
}

// ErrPodNotSeen is the kind of error Deferral.Decide returns when its PodRuntimes does not know the pod
// named in the volume context (an informer that has not caught up): it is ErrUnavailable, so kubelet,
// given it, retries the publish.
var ErrPodNotSeen = errdefs.New(errdefs.ErrUnavailable, "pod not yet known to the node plugin")

// ErrNoPodInfo is the kind of error Deferral.Decide returns, with Pods set, for a volume context that asks
// for deferral but names no pod: kubelet sends the pod only when the driver's CSIDriver object sets
// podInfoOnMount: true. Deciding without the pod would defer the volume of a runc pod too, whose data would
// then land in the node's own filesystem; it is ErrFailedPrecondition.
var ErrNoPodInfo = errdefs.New(errdefs.ErrFailedPrecondition, "the volume context names no pod: set podInfoOnMount: true "+
	"on the driver's CSIDriver object, so that kubelet sends the pod with every publish")

// Deferral decides, pod by pod, what a node plugin does with a NodePublishVolume, as crust-csi-proxy
// does: a volume whose context asks for deferral is deferred for a pod that runs in a microVM and
// mounted on the host for any other. The zero value defers every mount volume that asks.
type Deferral struct {
	// Handlers are the microVM runtime handlers.
	Handlers Handlers
	// DefaultHandler is the runtime handler of pods that name no RuntimeClass: the node's containerd
	// default runtime; "" stands for one that runs containers on the host (runc).
	DefaultHandler string
	// Pods looks pods up. Nil: no per-pod decision, every mount volume that asks for deferral is deferred.
	Pods PodRuntimes
	// PodWait is how long Decide waits for Pods to learn of a pod it does not know yet.
	PodWait time.Duration
}

// Decide returns what to do with a publish of capability c and volumeContext, and why, in words fit for
// a log or an Event. A raw block capability, or a context that does not ask for deferral
// (volume.Deferred), passes through. A context that asks is deferred when Pods is nil; with Pods, one
// that holds no pod information (podInfoOnMount) is an error wrapping ErrNoPodInfo; otherwise the pod's
// runtime handler decides: a match of Handlers is deferred, any
// other handler host-mounted, except a volume that asks for encryption (volume.ParseEncryption), which
// only a sandbox opens: that is an error of kind FailedPrecondition (or InvalidArgument, naming the key,
// for malformed encryption keys). An error wrapping ErrPodNotSeen says the pod stayed unknown for PodWait
// (or until ctx ended).
func (d Deferral) Decide(ctx context.Context, c *csi.VolumeCapability, volumeContext map[string]string) (Decision, string, error) {
	switch {
	case c.GetBlock() != nil:
		return PassThrough, ReasonRawBlock, nil
	case c.GetMount() == nil:
		return PassThrough, "not a mount capability", nil
	case !volume.Deferred(volumeContext):
		return PassThrough, "volume context does not ask for deferral", nil
	case d.Pods == nil:
		return Defer, "deferral asked, no pod look-ups", nil
	}
	pod := PodInfo(volumeContext)
	if pod.Namespace == "" || pod.Name == "" {
		return PassThrough, "", fmt.Errorf("deferral asked and pods are looked up, but %w", ErrNoPodInfo)
	}
	handler, found := d.Pods.RuntimeHandler(pod)
	for deadline := time.Now().Add(d.PodWait); !found; handler, found = d.Pods.RuntimeHandler(pod) {
		if time.Now().After(deadline) {
			return PassThrough, "", fmt.Errorf("pod %s/%s: %w; retry", pod.Namespace, pod.Name, ErrPodNotSeen)
		}
		select {
		case <-ctx.Done():
			return PassThrough, "", fmt.Errorf("pod %s/%s: %w (%w)", pod.Namespace, pod.Name, ErrPodNotSeen, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	whose := "pod's runtime handler "
	if handler == "" {
		if handler, whose = d.DefaultHandler, "the node's default runtime handler "; handler == "" {
			return onHost(pod, volumeContext, "pod has no runtimeClassName")
		}
	}
	if p, ok := d.Handlers.Match(handler); ok {
		return Defer, whose + handler + " is a microVM handler (matches pattern " + p + ")", nil
	}
	return onHost(pod, volumeContext, whose+handler+" is not a microVM handler (matches none of "+strings.Join(d.Handlers, ",")+")")
}

// onHost is HostMount for why, unless the volume asks for encryption, which only a sandbox gives: then
// an error of kind FailedPrecondition, as mounting it in the clear on the node would defeat it.
func onHost(pod Pod, volumeContext map[string]string, why string) (Decision, string, error) {
	if enc, err := volume.ParseEncryption(volumeContext); err != nil || enc != nil {
		if err == nil {
			err = errdefs.Errorf(errdefs.ErrFailedPrecondition, "volume asks for encryption inside the sandbox (%s), "+
				"and pod %s/%s runs on the host: %s; give the pod a microVM RuntimeClass", volume.EncryptionParamKey, pod.Namespace, pod.Name, why)
		}
		return PassThrough, "", err
	}
	return HostMount, why, nil
}
