package volume

import (
	"strconv"
	"strings"
)

// DeferKey is the StorageClass parameter (which provisioners copy into a volume's context) that asks
// for deferral: crust.dev/defer: "true".
const DeferKey = "crust.dev/defer"

// Keys kubelet puts in NodePublishVolume's volume context when the CSIDriver object sets podInfoOnMount.
// crustd accepts the first five as descriptor metadata by default; ServiceAccountTokensKey is secret and
// never taken.
const (
	PodNameKey              = "csi.storage.k8s.io/pod.name"
	PodNamespaceKey         = "csi.storage.k8s.io/pod.namespace"
	PodUIDKey               = "csi.storage.k8s.io/pod.uid"
	ServiceAccountKey       = "csi.storage.k8s.io/serviceAccount.name"
	EphemeralKey            = "csi.storage.k8s.io/ephemeral"
	ServiceAccountTokensKey = "csi.storage.k8s.io/serviceAccount.tokens"
)

// Keys of Kata's direct-volume metadata that crust's descriptors share.
const (
	// EncryptionKey holds the key of an encrypted volume; it is secret (IsSecretKey).
	EncryptionKey = "encryptionKey"
	// CreateFilesystemKey ("true" or "false") asks for a blank device to be formatted in the guest; crust
	// carries it in the typed field create_filesystem.
	CreateFilesystemKey = "createFilesystem"
	// FSGroupKey and FSGroupChangePolicyKey are Kata's fsGroup; crust carries them in the typed fields
	// volume_supplemental_group and supplemental_group_change_policy.
	FSGroupKey             = "fsGroup"
	FSGroupChangePolicyKey = "fsGroupChangePolicy"
)

// DefaultMetadataKeys are the metadata keys crustd accepts without configuration: EncryptionKey,
// EncryptionIntegrityKey and kubelet's pod information. The list is a copy.
func DefaultMetadataKeys() []string {
	return []string{EncryptionKey, EncryptionIntegrityKey, PodNameKey, PodNamespaceKey, PodUIDKey, ServiceAccountKey, EphemeralKey}
}

// TypedField returns the VolumeSpec field that stands for a Kata metadata key which has a typed field
// (fsGroup, fsGroupChangePolicy, createFilesystem, in any case), or "" for any other key. crustd refuses
// such keys as metadata, except CreateFilesystemKey spelt exactly so, which it folds into the field.
func TypedField(key string) string {
	switch strings.ToLower(key) {
	case strings.ToLower(FSGroupKey):
		return "volume_supplemental_group"
	case strings.ToLower(FSGroupChangePolicyKey):
		return "supplemental_group_change_policy"
	case strings.ToLower(CreateFilesystemKey):
		return "create_filesystem"
	}
	return ""
}

// IsParameterKey reports whether a StorageClass parameter (or volume context key) is crust's own rather
// than the driver's: DeferKey, one of IOLimitKeys, EncryptionParamKey or EncryptionIntegrityKey.
func IsParameterKey(key string) bool {
	return key == DeferKey || IsIOLimitKey(key) || key == EncryptionParamKey || key == EncryptionIntegrityKey
}

// Deferred reports whether a volume context (or StorageClass parameters) asks for deferral: DeferKey set
// to true (any form strconv.ParseBool accepts, such as "true" or "True"). Anything else, a missing key
// included, is false.
func Deferred(volumeContext map[string]string) bool {
	v, ok := volumeContext[DeferKey]
	if !ok {
		return false
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	return err == nil && b
}
