package csiproxy

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
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

// Decision is what the proxy does with a NodePublishVolume.
type Decision int

// Decisions.
const (
	PassThrough Decision = iota // forward to the driver unchanged
	Defer                       // raw block publish, descriptor deposited with crustd
	HostMount                   // raw block publish, formatted and mounted on the host by the proxy
)

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

// errPodNotSeen is returned when the pod named in the volume context is not (yet) in the cache.
var errPodNotSeen = errors.New("pod not yet in the proxy's cache")

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
	// Pods is nil without --kubeconfig.
	Pods PodSource
	// Handlers are the microVM runtime handlers' patterns.
	Handlers Handlers
	// DefaultHandler is the runtime handler of the pods that name no RuntimeClass: the node's containerd
	// default runtime (--default-runtime-handler); "" when it is not known, taken as a runtime that runs
	// containers on the host (runc).
	DefaultHandler string
}

// Handlers are the patterns of --microvm-handlers: a pod whose RuntimeClass handler matches one of them
// (path.Match: "kata" matches kata alone, "kata-*" every handler that starts with "kata-") is a microVM
// pod. Make them with ParseHandlers.
type Handlers []string

// ParseHandlers checks each pattern's syntax and returns the non-empty ones; a malformed pattern is an
// error naming the flag and the pattern.
func ParseHandlers(patterns []string) (Handlers, error) {
	var h Handlers
	for _, p := range patterns {
		if p == "" {
			continue
		}
		// path.Match checks the whole pattern, whatever the name, before it answers false.
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("--microvm-handlers: pattern %q: %w (patterns use path.Match syntax: *, ?, [a-z])", p, err)
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

// Decide applies the deferral rules of the package documentation. It fails (wrapping errPodNotSeen)
// only when a pod source is configured, the volume context names a pod and the cache does not hold it,
// or holds another pod of that name.
func Decide(in DecideInput) (Decision, string, error) {
	if in.Capability.GetBlock() != nil {
		return PassThrough, ReasonRawBlock, nil
	}
	if !isMount(in.Capability) {
		return PassThrough, "not a mount capability", nil
	}
	if !DeferRequested(in.VolumeContext) {
		return PassThrough, "volume context does not ask for deferral", nil
	}
	if in.StagingPath != "" && !in.StagedAsBlock {
		return PassThrough, "staging path was not staged as raw block by the proxy", nil
	}
	if in.Pods == nil {
		return Defer, "deferral asked, no pod source", nil
	}
	pod := client.PodInfo(in.VolumeContext)
	ns, name := pod.Namespace, pod.Name
	if ns == "" || name == "" {
		return Defer, "deferral asked, no pod info in the volume context", nil
	}
	p, ok := in.Pods.Pod(ns, name)
	if !ok {
		return PassThrough, "", errPodNotSeen
	}
	if pod.UID != "" && p.UID != "" && pod.UID != p.UID {
		return PassThrough, "", errPodNotSeen
	}
	handler, whose := in.DefaultHandler, "the node's default runtime handler "
	if p.RuntimeClassName != "" {
		var ok bool
		if handler, ok = in.Pods.RuntimeHandler(p.RuntimeClassName); !ok {
			handler = p.RuntimeClassName
		}
		whose = "pod's runtime handler "
	} else if handler == "" {
		return HostMount, "pod has no runtimeClassName", nil
	}
	if p, ok := in.Handlers.Match(handler); ok {
		return Defer, whose + handler + " is a microVM handler (matches --microvm-handlers pattern " + p + ")", nil
	}
	return HostMount, whose + handler + " is not a microVM handler (matches none of --microvm-handlers " +
		strings.Join(in.Handlers, ",") + ")", nil
}

// decideWaiting is Decide, retried while the pod is not yet in the cache, for at most wait.
func decideWaiting(ctx context.Context, in DecideInput, wait time.Duration) (Decision, string, error) {
	deadline := time.Now().Add(wait)
	for {
		d, why, err := Decide(in)
		if !errors.Is(err, errPodNotSeen) || time.Now().After(deadline) {
			return d, why, err
		}
		select {
		case <-ctx.Done():
			return d, why, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
