package client

import (
	"strconv"
	"strings"
)

// DeferKey is the volume context key (a StorageClass parameter, which provisioners copy into the
// volume's context) that asks for deferral: crust.dev/defer: "true".
const DeferKey = "crust.dev/defer"

// Keys kubelet puts in NodePublishVolume's volume context when the CSIDriver object sets podInfoOnMount.
const (
	PodNameKey        = "csi.storage.k8s.io/pod.name"
	PodNamespaceKey   = "csi.storage.k8s.io/pod.namespace"
	PodUIDKey         = "csi.storage.k8s.io/pod.uid"
	ServiceAccountKey = "csi.storage.k8s.io/serviceAccount.name"
	EphemeralKey      = "csi.storage.k8s.io/ephemeral"
)

// Deferred reports whether the volume context asks for deferral: DeferKey set to true (any form
// strconv.ParseBool accepts, such as "true" or "True"). Anything else, a missing key included, is false.
func Deferred(volumeContext map[string]string) bool {
	v, ok := volumeContext[DeferKey]
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	return err == nil && b
}

// Pod is the pod information kubelet passes on mount.
type Pod struct {
	Name           string
	Namespace      string
	UID            string
	ServiceAccount string
	// Ephemeral is true for a CSI ephemeral inline volume.
	Ephemeral bool
}

// PodInfo returns the pod information in a volume context; fields whose key is absent are empty. The
// service account's tokens (csi.storage.k8s.io/serviceAccount.tokens) are secret and never taken.
func PodInfo(volumeContext map[string]string) Pod {
	eph, _ := strconv.ParseBool(volumeContext[EphemeralKey])
	return Pod{
		Name:           volumeContext[PodNameKey],
		Namespace:      volumeContext[PodNamespaceKey],
		UID:            volumeContext[PodUIDKey],
		ServiceAccount: volumeContext[ServiceAccountKey],
		Ephemeral:      eph,
	}
}

// Metadata returns the pod information as descriptor metadata under kubelet's keys, which crustd accepts
// by default: only the fields that are set (Ephemeral only when true), nil when none is.
func (p Pod) Metadata() map[string]string {
	md := map[string]string{}
	for k, v := range map[string]string{
		PodNameKey: p.Name, PodNamespaceKey: p.Namespace, PodUIDKey: p.UID, ServiceAccountKey: p.ServiceAccount,
	} {
		if v != "" {
			md[k] = v
		}
	}
	if p.Ephemeral {
		md[EphemeralKey] = "true"
	}
	if len(md) == 0 {
		return nil
	}
	return md
}
