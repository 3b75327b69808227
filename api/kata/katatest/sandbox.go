package katatest

import (
	"encoding/base64"
	"os"
	"path/filepath"
)

// RecordSandbox does what a Kata shim does when a sandbox starts to use the direct-assigned volume at
// volumePath under the direct-volume directory dir: it creates an empty file named sandboxID (mode 0600)
// beside the volume's mountInfo.json, and fails as Kata does when that file is missing. Recording the
// same id again is not an error. Like the shim, it trusts the directory: it is for tests and stand-in
// shims, never for a directory another user could touch.
func RecordSandbox(dir, volumePath, sandboxID string) error {
	volDir := filepath.Join(dir, base64.URLEncoding.EncodeToString([]byte(volumePath)))
	if _, err := os.Stat(filepath.Join(volDir, "mountInfo.json")); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(volDir, sandboxID), nil, 0o600)
}
