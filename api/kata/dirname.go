package kata

import (
	"encoding/base64"
	"fmt"

	"crust.dev/crust/api/errdefs"
)

// maxNameLen is the longest file name Linux filesystems take (NAME_MAX).
const maxNameLen = 255

// MaxVolumePathLen is the longest volume path whose directory name fits in a file name.
const MaxVolumePathLen = maxNameLen / 4 * 3

var (
	// ErrInvalidVolumePath is returned for a volume path that has no volume directory: an empty one, or
	// one longer than MaxVolumePathLen.
	ErrInvalidVolumePath = errdefs.New(errdefs.ErrInvalidArgument, "invalid volume path")
	// ErrInvalidDirName is returned for a name that VolumeDirName does not produce.
	ErrInvalidDirName = errdefs.New(errdefs.ErrInvalidArgument, "not a volume directory name")
)

// VolumeDirName returns the name of the directory that holds the files of volumePath: its base64 URL
// encoding with padding, as Kata derives it. The result never starts with a dot.
func VolumeDirName(volumePath string) string {
	return base64.URLEncoding.EncodeToString([]byte(volumePath))
}

// ParseVolumeDirName is the inverse of VolumeDirName. It accepts only names that VolumeDirName returns for
// a non-empty path, so each volume has exactly one directory name.
func ParseVolumeDirName(name string) (string, error) {
	b, err := base64.URLEncoding.Strict().DecodeString(name)
	// The decoder skips '\r' and '\n'; encoding back rejects names that hold them.
	if err != nil || len(b) == 0 || VolumeDirName(string(b)) != name {
		return "", fmt.Errorf("%w: %q", ErrInvalidDirName, name)
	}
	return string(b), nil
}

// checkVolumePath says why volumePath has no volume directory, or returns nil. Kata takes any string,
// relative paths included; these two cases would fail in Kata too, with a less clear error.
func checkVolumePath(volumePath string) error {
	switch {
	case volumePath == "":
		return fmt.Errorf("%w: empty", ErrInvalidVolumePath)
	case len(volumePath) > MaxVolumePathLen:
		return fmt.Errorf("%w: %d bytes, longer than %d (its directory name would exceed %d bytes)",
			ErrInvalidVolumePath, len(volumePath), MaxVolumePathLen, maxNameLen)
	}
	return nil
}
