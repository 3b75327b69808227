// Package lvmdriver is crust's reference CSI driver: local LVM logical volumes in one volume group, with
// the Identity, Controller and Node services on one unix socket, and crust's deferral through
// crust.dev/crust/api/client. It shows a driver author what taking part in crust costs (a few calls in
// the node service), runs under crust's test tiers and csi-sanity, and ships as the image that
// deploy/examples deploys (crust/crust-lvm-csi). It is a Go module of its own, so that its dependencies
// (go-fuse, for the extent map) stay out of crust's.
//
// What it offers:
//
//   - Identity: GetPluginInfo, GetPluginCapabilities (CONTROLLER_SERVICE, online VolumeExpansion), Probe
//     (ready while the volume group answers).
//   - Controller (CREATE_DELETE_VOLUME, EXPAND_VOLUME): CreateVolume makes a linear logical volume
//     (lvcreate) of at least required_bytes and at most limit_bytes, rounded up to the extent size, tagged
//     crust-csi; the volume id is the logical volume's name, derived from the CSI name, so a repeated
//     CreateVolume returns the same volume, and one whose capacity range the volume does not fit fails with
//     AlreadyExists. DeleteVolume removes it (lvremove); an unknown id is a success, a volume still in use
//     is FailedPrecondition. ControllerExpandVolume grows it (lvextend), online. ValidateVolumeCapabilities
//     confirms single-node mount (ext4, ext3, xfs) and block capabilities.
//   - Node (STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS, EXPAND_VOLUME, VOLUME_MOUNT_GROUP): a mount volume is
//     formatted when blank and mounted at the staging path (k8s.io/mount-utils), then bind-mounted at the
//     target path; a block volume's device node is bind-mounted on a file at the target path.
//     NodeGetVolumeStats reports statfs bytes and inodes for a mount and the device size for a block
//     volume; NodeExpandVolume grows ext4 (resize2fs) and xfs (xfs_growfs) online. The kernel lets ext4 grow
//     online only with CAP_SYS_RESOURCE (xfs needs CAP_SYS_ADMIN), which some sandboxes, such as crust's
//     test machines, do not grant.
//   - Deferral: when Config.CrustSocket is set and the volume context (the StorageClass parameters) says
//     crust.dev/defer: "true", NodeStageVolume of a mount volume does nothing on the host and
//     NodePublishVolume deposits the descriptor of /dev/<vg>/<lv> with crustd (api/client, with
//     CreateFilesystem) instead of mounting; NodeUnpublishVolume, NodeGetVolumeStats and NodeExpandVolume
//     of a target crustd holds go to crustd (those requests carry no volume context, so the driver asks
//     crustd whether it holds the path; while crustd cannot be reached they fail with Unavailable, and
//     kubelet retries). Before any sandbox claims such a volume, crustd answers stats with the device's
//     size (usage unknown) and records an expansion for the sandbox's mount. Block volumes are never
//     deferred.
//
// Errors follow the CSI spec: InvalidArgument for a missing or malformed field (the message names it),
// NotFound for an unknown volume id or a path the volume is not at, AlreadyExists for a name or target
// in use with other parameters, OutOfRange for a capacity the range forbids, ResourceExhausted when the
// volume group lacks space, FailedPrecondition for a volume in use or not staged, Aborted while another
// call on the same volume is in flight. Every call is logged with log/slog; secrets (the fields the spec
// marks csi_secret) are never logged.
//
// Logical volumes become block devices through LVM's own activation where the kernel has device-mapper,
// and through an extent map (ActivationExtentMap) where it does not, as on crust's test machines.
//
// Start runs the driver on a socket for tests in any package; the runner in cmd/crust-lvm-csi runs it as
// a process. lvmtest makes the volume group.
package lvmdriver
