package kata

import (
	"encoding/json"
	"fmt"

	"crust.dev/crust/api/errdefs"
)

// DefaultDir is where Kata looks for direct-assigned volumes.
const DefaultDir = "/run/kata-containers/shared/direct-volumes"

// MountInfoFileName is the name of the file, inside a volume directory, that holds the MountInfo.
const MountInfoFileName = "mountInfo.json"

// Metadata keys that Kata understands.
const (
	// MetadataFSGroup is the pod's fsGroup as a decimal number.
	MetadataFSGroup = "fsGroup"
	// MetadataFSGroupChangePolicy is FSGroupChangeAlways or FSGroupChangeOnRootMismatch; Kata ignores it
	// without MetadataFSGroup.
	MetadataFSGroupChangePolicy = "fsGroupChangePolicy"
	// MetadataEncryptionKey asks for an encrypted volume (for example "ephemeral").
	MetadataEncryptionKey = "encryptionKey"
	// MetadataCreateFilesystem, "true", asks for the device to be formatted in the guest when blank.
	MetadataCreateFilesystem = "createFilesystem"
)

// Values of MetadataFSGroupChangePolicy.
const (
	FSGroupChangeAlways         = "Always"
	FSGroupChangeOnRootMismatch = "OnRootMismatch"
)

// Values of MountInfo.VolumeType.
const (
	// VolumeTypeDirect is the type Kata's runtime-rs requires for a block device or a raw image file;
	// it refuses any other type for them. Kata's Go runtime does not read the volume type.
	VolumeTypeDirect = "directvol"
	// VolumeTypeBlock is the type used in the examples of Kata's Go runtime. runtime-rs refuses it.
	VolumeTypeBlock = "block"
	// VolumeTypeBlk is Kata's name for a virtio-blk block device, which some tools write as the volume
	// type. Kata's Go runtime takes it like any other type; runtime-rs refuses it.
	VolumeTypeBlk = "blk"
)

// IsBlockVolumeType reports whether volume-type t names a block device or raw image file, for a reader of
// entries crust did not write: VolumeTypeDirect, VolumeTypeBlock or VolumeTypeBlk, exactly so spelt. Kata's
// Go runtime does not read the type at all and runtime-rs takes VolumeTypeDirect only, so these three are
// what writers for either runtime use; Kata's other types (vfiovol, spdkvol, spoolvol) name devices that
// are not attached as disks. crust itself always writes VolumeTypeDirect.
func IsBlockVolumeType(t string) bool {
	switch t {
	case VolumeTypeDirect, VolumeTypeBlock, VolumeTypeBlk:
		return true
	}
	return false
}

// MountInfo is the content of mountInfo.json. Its encoding/json output is byte for byte what Kata writes
// for the same values.
type MountInfo struct {
	// VolumeType is the kind of volume, such as VolumeTypeDirect.
	VolumeType string `json:"volume-type"`
	// Device is the host path of the device (or image file) that backs the volume.
	Device string `json:"device"`
	// FsType is the filesystem to mount it as, such as ext4.
	FsType string `json:"fstype"`
	// Metadata holds extra settings, keyed by the Metadata* constants among others.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Options are mount options, one per entry; "ro" makes Kata attach the device read-only.
	Options []string `json:"options,omitempty"`
}

// ErrInvalidMountInfo is returned for mount info that Kata would not accept.
var ErrInvalidMountInfo = errdefs.New(errdefs.ErrInvalidArgument, "invalid mount info")

// ParseMountInfo decodes mount info JSON as Kata does: any JSON that encoding/json decodes into a MountInfo
// is accepted, unknown keys are ignored, and null stands for an absent value. Anything else is an
// ErrInvalidMountInfo.
func ParseMountInfo(data []byte) (*MountInfo, error) {
	var info MountInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidMountInfo, err)
	}
	return &info, nil
}
