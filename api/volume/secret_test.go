package volume_test

import (
	"testing"

	"crust.dev/crust/api/volume"
)

func TestIsSecretKey(t *testing.T) {
	for key, want := range map[string]bool{
		"encryptionKey": true,
		"csi.storage.k8s.io/serviceAccount.tokens": true,
		"example.com/db-password":                  true,
		"example.com/Passphrase":                   true,
		"example.com/SECRET":                       true,
		"example.com/client-credentials":           true,
		"example.com/tls.key":                      true,
		"example.com/auth-header":                  true,
		"csi.storage.k8s.io/pod.name":              false,
		"csi.storage.k8s.io/pod.namespace":         false,
		"csi.storage.k8s.io/pod.uid":               false,
		"csi.storage.k8s.io/serviceAccount.name":   false,
		"csi.storage.k8s.io/ephemeral":             false,
	} {
		if got := volume.IsSecretKey(key); got != want {
			t.Errorf("IsSecretKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestRedact(t *testing.T) {
	in := map[string]string{"encryptionKey": "hunter2", "csi.storage.k8s.io/pod.name": "web-0"}
	got := volume.Redact(in)
	if got["encryptionKey"] != volume.Redacted || got["csi.storage.k8s.io/pod.name"] != "web-0" || len(got) != 2 {
		t.Errorf("Redact = %v", got)
	}
	if in["encryptionKey"] != "hunter2" {
		t.Errorf("Redact modified its argument")
	}
	if volume.Redact(nil) != nil {
		t.Errorf("Redact(nil) is not nil")
	}
}
