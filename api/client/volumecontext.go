package client

import (
	"strconv"

	"crust.dev/crust/api/volume"
)

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
	eph, _ := strconv.ParseBool(volumeContext[volume.EphemeralKey])
	return Pod{
		Name:           volumeContext[volume.PodNameKey],
		Namespace:      volumeContext[volume.PodNamespaceKey],
		UID:            volumeContext[volume.PodUIDKey],
		ServiceAccount: volumeContext[volume.ServiceAccountKey],
		Ephemeral:      eph,
	}
}

// Metadata returns the pod information as descriptor metadata under kubelet's keys, which crustd accepts
// by default: only the fields that are set (Ephemeral only when true), nil when none is.
func (p Pod) Metadata() map[string]string {
	md := map[string]string{}
	for k, v := range map[string]string{
		volume.PodNameKey: p.Name, volume.PodNamespaceKey: p.Namespace, volume.PodUIDKey: p.UID, volume.ServiceAccountKey: p.ServiceAccount,
	} {
		if v != "" {
			md[k] = v
		}
	}
	if p.Ephemeral {
		md[volume.EphemeralKey] = "true"
	}
	if len(md) == 0 {
		return nil
	}
	return md
}
