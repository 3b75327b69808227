package csiproxy

import (
	"sync"

	"crust.dev/crust/api/volume"
)

// stageKeys holds the encryption keys that came with NodeStageVolume's secrets (a StorageClass's
// node-stage secret), by staging path, for the publishes of those volumes, whose own secrets lack one.
// They are kept in memory only, as a key is written nowhere on the node: a proxy restarted between stage
// and publish has lost them, and the publish is refused saying so (the volume is staged again, and the
// key given again, once no pod uses it).
type stageKeys struct {
	mu sync.Mutex
	m  map[string]string
}

// stageKey returns the key in a stage's secrets when its volume context asks for encryption, "" when it
// asks for none or the secrets hold no key; a key that is there but unusable (empty, too long) is an
// InvalidArgument naming the secret's entry.
func stageKey(volCtx, secrets map[string]string) (string, error) {
	if enc, err := volume.ParseEncryption(volCtx); err != nil || enc == nil {
		return "", err
	}
	if _, given := secrets[volume.EncryptionSecretKey]; !given {
		return "", nil
	}
	return volume.EncryptionKeyFrom(secrets)
}

// set keeps key for the volume staged at path.
func (k *stageKeys) set(path, key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]string{}
	}
	k.m[path] = key
}

// forget drops the key of the volume staged at path.
func (k *stageKeys) forget(path string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m, path)
}

// get returns the key given at the stage of path, if any.
func (k *stageKeys) get(path string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok := k.m[path]
	return key, ok
}
