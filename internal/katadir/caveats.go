package katadir

import (
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// PmemCaveat and PmemFileCaveat are what an unmodified Kata runtime does with a persistent-memory
// volume from the Kata projection. Kata's Go runtime reads the device from mountInfo.json and hot-plugs a
// block device as it does any other (with its block_device_driver), so the guest mounts a disk through its
// page cache; a regular file it does not hot-plug at all (it makes a device only of a block device, or of a
// loop device's file that carries an NVDIMM info block).
const (
	PmemCaveat = "Kata attaches a pmem volume as a plain disk (its block_device_driver, virtio-blk or " +
		"virtio-scsi) and mounts it without DAX, through the guest's page cache; crust-microvm attaches it as " +
		"virtio-pmem and mounts it with -o dax"
	PmemFileCaveat = "Kata does not attach a file-backed pmem volume (it hot-plugs only block devices from " +
		"a direct-assigned volume), so Kata cannot use it, with DAX or without; crust-microvm attaches it as " +
		"virtio-pmem and mounts it with -o dax"
	RawBlockCaveat = "raw block (volume_mode VOLUME_MODE_BLOCK) is not projected into the Kata direct-volume " +
		"directory: Kata mounts every direct-assigned volume as a filesystem, so an unmodified Kata runtime " +
		"gets this device only as the raw block device kubelet maps into the pod, not from crust"
	IOLimitsCaveat = "Kata ignores the I/O limits: its mountInfo.json has no place for them, so an unmodified " +
		"Kata runtime attaches the device without throttling"
	// PathTooLongCaveat is the caveat of a volume whose target path has no Kata directory name (Nameable):
	// crustd holds it and serves it to crust's own handlers, but Kata never sees it.
	PathTooLongCaveat = "not projected into the Kata direct-volume directory: the target path is longer than " +
		"189 bytes, so its base64url form, which names a volume's directory there, does not fit in a file name " +
		"(NAME_MAX, 255 bytes) and Kata itself cannot name it; an unmodified Kata runtime does not find this " +
		"volume and gives the pod the empty target directory instead (a shorter PersistentVolume name makes a " +
		"shorter target path)"
)

// Caveats says, one sentence each, what an unmodified Kata runtime that takes v from the Kata projection
// cannot honour of it, or that Kata does not find v there at all (PathTooLongCaveat, alone); none when
// Kata takes it as crust's own handlers do. It reads only v's spec and device number.
func Caveats(v *crustv1.Volume) []string {
	if spec := v.GetSpec(); spec.GetVolumeMode() != crustv1.VolumeMode_VOLUME_MODE_BLOCK && !Nameable(spec.GetVolumeTargetPath()) {
		// Kata never sees it, so what Kata would make of the rest does not matter. (A raw block volume is
		// never projected, whatever its path; its caveat says what Kata gets of it.)
		return []string{PathTooLongCaveat}
	}
	var out []string
	if v.GetSpec().GetVolumeType() == crustv1.VolumeType_VOLUME_TYPE_PMEM {
		if v.GetDeviceNumber().GetInode() != 0 { // a regular file: its device number is its filesystem's and inode
			out = append(out, PmemFileCaveat)
		} else {
			out = append(out, PmemCaveat)
		}
	}
	if v.GetSpec().GetVolumeMode() == crustv1.VolumeMode_VOLUME_MODE_BLOCK {
		out = append(out, RawBlockCaveat)
	}
	if v.GetSpec().GetIoLimits() != nil {
		out = append(out, IOLimitsCaveat)
	}
	return out
}

// Annotate returns v for an answer: v itself when it has no caveats, or else a copy with kata_caveats
// filled (Caveats). v is never changed (stored volumes are shared with watchers), and the caveats are
// never stored: the server adds them to each answer.
func (*Adapter) Annotate(v *crustv1.Volume) *crustv1.Volume {
	c := Caveats(v)
	if v == nil || len(c) == 0 {
		return v
	}
	out := proto.CloneOf(v)
	out.KataCaveats = c
	return out
}
