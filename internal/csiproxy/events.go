package csiproxy

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"crust.dev/crust/api/client"
)

// Reasons of the Events the proxy records on a pod, so that `kubectl describe pod` says what became of
// the pod's volumes: deferred to its sandbox, mounted on the host instead (and why), why a deferral
// failed, or which other pod holds the volume (one writer per device) and what to do; that no sandbox claims a deferred volume while the pod runs, and that what a runtime wrote into
// a deferred volume's target on the node was moved into the quarantine. Repeats of an event are counted
// by the recorder, not recorded again.
const (
	ReasonDeferred        = "VolumeDeferred"
	ReasonHostMounted     = "VolumeMountedOnHost"
	ReasonDeferralFailed  = "VolumeDeferralFailed"
	ReasonHeld            = "VolumeHeldByAnotherPod"
	ReasonNotConsumed     = "VolumeNotConsumed"
	ReasonDataQuarantined = "VolumeDataQuarantined"
)

// newRecorder records events through cs until ctx ends.
func newRecorder(ctx context.Context, cs kubernetes.Interface, node string) record.EventRecorder {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	go func() { <-ctx.Done(); b.Shutdown() }()
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "crust-csi-proxy", Host: node})
}

// podEvent records an event on pod, the pod a publish is for as its volume context names it
// (client.PodInfo); it does nothing without a recorder (no --kubeconfig) or without the pod's namespace
// and name.
func (p *Proxy) podEvent(pod client.Pod, eventType, reason, format string, args ...any) {
	if p.events == nil || pod.Namespace == "" || pod.Name == "" {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}
	p.events.Eventf(ref, eventType, reason, format, args...)
}

// kataCaveats is what a pod's Event adds of a deferred volume's Kata caveats (as crustd answers them, in
// kata_caveats): "" when there are none, so that whoever reads the Events of a pod of a Kata runtime
// learns what Kata will not honour of the volume, or that Kata will not find it at all.
func kataCaveats(caveats []string) string {
	if len(caveats) == 0 {
		return ""
	}
	return "; Kata caveats: " + strings.Join(caveats, "; ")
}
