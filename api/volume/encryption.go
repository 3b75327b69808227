package volume

import (
	"strconv"
	"strings"

	"crust.dev/crust/api/errdefs"
)

// StorageClass parameters (which reach the volume context as DeferKey does) that have a deferred volume
// encrypted inside the sandbox, so that the node never sees its data in the clear.
const (
	// EncryptionParamKey names the encryption: "luks2" (the only one) has the runtime open the device as a
	// LUKS2 volume in the guest, formatting it so when it is blank. Absent or "" means none.
	EncryptionParamKey = "crust.dev/encryption"
	// EncryptionIntegrityKey "true" (strconv.ParseBool) adds dm-integrity under dm-crypt: authenticated
	// encryption, at the cost of space, speed and online growth. Only with EncryptionParamKey.
	EncryptionIntegrityKey = "crust.dev/encryption-integrity"
)

// EncryptionLUKS2 is the one value of EncryptionParamKey.
const EncryptionLUKS2 = "luks2"

// EncryptionSecretKey is the entry of the Secret that holds an encrypted volume's key: the Secret the
// StorageClass names with csi.storage.k8s.io/node-publish-secret-name and -namespace, which kubelet hands
// to NodePublishVolume (or, behind crust-csi-proxy, its node-stage secret, handed to NodeStageVolume).
const EncryptionSecretKey = "encryptionKey"

// MaxEncryptionKey is the longest key accepted, in bytes (the longest LUKS2 passphrase the reference
// runtime takes).
const MaxEncryptionKey = 512

// Encryption is what a volume context asks of encryption.
type Encryption struct {
	// Integrity is authenticated encryption (EncryptionIntegrityKey).
	Integrity bool
}

// ParseEncryption reads EncryptionParamKey and EncryptionIntegrityKey from a volume context (or
// StorageClass parameters): nil when no encryption is asked. An unknown encryption, an integrity value
// that is not a boolean, or integrity without encryption give a *errdefs.FieldError naming the key.
func ParseEncryption(volumeContext map[string]string) (*Encryption, error) {
	name := strings.TrimSpace(volumeContext[EncryptionParamKey])
	integrity := false
	if v, ok := volumeContext[EncryptionIntegrityKey]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return nil, errdefs.Field(EncryptionIntegrityKey, "%q is not a boolean (true or false)", v)
		}
		integrity = b
	}
	switch {
	case name == "" && integrity:
		return nil, errdefs.Field(EncryptionIntegrityKey, "integrity needs %s: %s", EncryptionParamKey, EncryptionLUKS2)
	case name == "":
		return nil, nil
	case name != EncryptionLUKS2:
		return nil, errdefs.Field(EncryptionParamKey, "%q is not an encryption crust knows (the one is %q)", name, EncryptionLUKS2)
	}
	return &Encryption{Integrity: integrity}, nil
}

// EncryptionKeyFrom returns the key in a node call's secrets (EncryptionSecretKey), checked: present, not
// empty and at most MaxEncryptionKey bytes; otherwise a *errdefs.FieldError naming the secret's entry,
// which never holds the key.
func EncryptionKeyFrom(secrets map[string]string) (string, error) {
	key, ok := secrets[EncryptionSecretKey]
	switch {
	case !ok || key == "":
		return "", errdefs.Field("secrets."+EncryptionSecretKey, "the volume asks for encryption (%s) and the secrets "+
			"hold no %s: name a Secret that does as the StorageClass's node-publish secret (csi.storage.k8s.io/node-publish-"+
			"secret-name and -namespace) or, behind crust-csi-proxy, its node-stage secret (which the proxy keeps in memory "+
			"only: after its restart, the volume must be staged again)", EncryptionParamKey, EncryptionSecretKey)
	case len(key) > MaxEncryptionKey:
		return "", errdefs.Field("secrets."+EncryptionSecretKey, "%d bytes, longer than %d", len(key), MaxEncryptionKey)
	}
	return key, nil
}
