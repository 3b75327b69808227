// Package csiproxy is crust-csi-proxy, the CO-mediated variant of crust: a CSI Identity and Node service
// served on the socket kubelet dials, in front of an unmodified CSI driver on another socket. For most
// calls it is a pass-through; for volumes that must be deferred it makes the driver publish a raw block
// device and deposits the descriptor with crustd itself, so that a microVM runtime mounts the volume
// inside the sandbox.
//
// # Pass-through
//
// Every Identity and Node call that is not deferred is forwarded to the driver as it came (metadata
// included; NodeStageVolume and NodePublishVolume byte for byte, when the proxy leaves them unchanged), and the driver's answer (response, or status with code, message and details) is returned as
// it came, with these exceptions, which servedCaps details: NodeGetCapabilities adds GET_VOLUME_STATS,
// EXPAND_VOLUME and VOLUME_MOUNT_GROUP to the driver's capabilities, and for a driver without them the
// proxy answers stats itself, expands as kubelet would without node expansion (not at all; both answer
// NOT_FOUND for a volume_path that is missing or not absolute, as CSI says for a volume not there), and keeps
// volume_mount_group from the driver and gives the published filesystem the group itself. Wherever the
// proxy gives a group (a host mount, a forwarded publish, a descriptor), it does so under the pod's
// fsGroupChangePolicy, read from its pod cache, since kubelet sends a driver the group but not the
// policy: OnRootMismatch when the pod asks for it, otherwise Always. Calls to any other service or method (the Controller service, when the driver serves it on the
// same socket, and methods newer than this build) are forwarded as raw frames. Requests are logged through
// one interceptor; fields CSI marks csi_secret, and values of secret-looking keys in volume_context,
// publish_context and parameters (service account tokens, an encryptionKey), are replaced by
// "<redacted>" (volume.StripSecrets) before anything is logged, and the bodies of raw-forwarded calls are never logged.
//
// # Controller
//
// With --controller the proxy serves Identity and Controller in front of the driver's controller socket
// instead: see controllerServer.
//
// # Deferral rules
//
// NodeStageVolume is deferrable when its capability is a mount (not block) capability and the volume
// asks for deferral: its volume context holds crust.dev/defer with a true value (strconv.ParseBool, as
// api/client's Deferred), or, when the context lacks the key (a static PersistentVolume, or one
// provisioned before the controller proxy), the StorageClass of its PersistentVolume does, as an informer
// cache of PersistentVolumes (by driver and volume handle) and StorageClasses says. The proxy then asks the driver for a raw
// block stage (the capability rewritten to Block, same access mode) and records the staging path.
//
// NodePublishVolume with a mount capability and crust.dev/defer true is decided as follows (Decide):
//
//   - When a staging path is given and the proxy has no stage record for it, the volume was staged as a
//     filesystem (before the proxy was there, or by another route): pass-through.
//   - Without a pod source (no --kubeconfig), or without pod info in the volume context
//     (csi.storage.k8s.io/pod.name and pod.namespace, sent when the CSIDriver has podInfoOnMount): deferred.
//   - Otherwise the pod is looked up in an informer cache restricted to this node (field selector
//     spec.nodeName); a pod not (yet) in the cache, or whose UID differs from pod.uid, fails the call with
//     UNAVAILABLE so that kubelet retries. A pod without runtimeClassName is not a microVM pod. A pod with
//     one is a microVM pod when the RuntimeClass's handler (read from a RuntimeClass informer; the
//     RuntimeClass name itself when it is not in the cache) matches one of the patterns of
//     --microvm-handlers (path.Match syntax: kata-* matches every handler whose name starts with kata-).
//   - A microVM pod: deferred. Any other pod: host-mounted.
//
// Deferred: the driver publishes raw block to a private path (beside kubelet's target, in the proxy's
// own directory crust.dev~block next to kubelet's mount and vol_data.json, so that a driver that sees
// only <kubelet>/pods sees it; under the state directory for a target of another shape); the proxy finds
// the device behind it (the bind-mounted node's rdev, named /dev/block/MAJ:MIN, or /dev/<DEVNAME> from
// /sys/dev/block/MAJ:MIN/uevent, or the private node itself), creates kubelet's target path as an empty
// directory and deposits the descriptor through crustd's StageVolume (built by api/client's StageRequest):
// the target path, the device, fs type from the original capability (ext4 when empty), its mount flags,
// read-only (the request's readonly, a "ro" flag or a reader-only access mode), fsGroup from
// volume_mount_group with the pod's fsGroupChangePolicy, the pod's info as metadata, the driver's name, create_filesystem=true.
// It then mounts the guard on the target, an empty read-only tmpfs, so that a runtime that uses the target
// instead of claiming the volume fails to write rather than writing to the node's disk (not for a pod with
// a subPath, nor one the cache does not hold: guard.go). NodeUnpublishVolume unmounts the guard, moves a
// target that holds data into the quarantine (releaseTarget), unstages at crustd, has the driver unpublish
// the private path, removes it and the target directory. While the pod runs, a deferred volume no sandbox
// claims is reported (checkConsumed).
// NodeGetVolumeStats, NodeGetVolumeHealth and NodeExpandVolume of a deferred volume go to crustd
// (GetVolumeStats, ExpandVolume), which forwards them to the runtime handler that claimed the volume; for expansion the
// driver's NodeExpandVolume is called first on the private block path when the driver has EXPAND_VOLUME.
// Before any sandbox claims the volume crustd answers them itself: stats give the device's size with usage
// unknown, and an expansion is recorded and carried out by the handler when it mounts the volume.
//
// Host-mounted: the same raw block publish to the private path, then the proxy formats the device when it
// holds no filesystem and mounts it on kubelet's target path (k8s.io/mount-utils SafeFormatAndMount), so
// one StorageClass serves microVM and other pods. Stats are measured with statfs on the target path;
// expansion resizes the filesystem on the host after the driver's NodeExpandVolume on the private path.
//
// Everything else (no flag, a block capability, no record) passes through. A raw block volume (a block
// capability) is never deferred, whatever its class and its pod: a microVM runtime takes the device
// kubelet maps into the pod and hands it to the sandbox itself. Its NodeStageVolume and NodePublishVolume
// reach the driver as the exact bytes kubelet sent (the proxy reads them before decoding), and the
// publish, when its class asks for deferral, is logged as a "publish decision" (decision pass-through,
// volume_mode block, and why) and counted in crust_csi_proxy_publish_decisions_total{decision,volume_mode},
// as every decided publish is.
//
// A repeated NodePublishVolume of a published path runs the steps again; asked with another volume, fs type
// or read-only flag it fails with ALREADY_EXISTS and the volume stays published. When a first
// deferred or host-mounted publish fails with a final code (anything but CANCELLED,
// DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED: after those kubelet keeps the volume as
// uncertain and calls again) the proxy undoes what it did before returning, because kubelet will not call
// NodeUnpublishVolume for it. If that undo fails, the call fails with ABORTED instead and the record stays.
//
// # Events
//
// With --kubeconfig the proxy records Events on the pod of each publish it decides: VolumeDeferred,
// VolumeMountedOnHost (with why the pod is not a microVM pod) and VolumeDeferralFailed (with the code and
// message of the step that failed), so that `kubectl describe pod` says what became of the volume; and,
// as warnings, VolumeNotConsumed for a deferred volume no sandbox claims while the pod runs and
// VolumeDataQuarantined for a target moved into the quarantine at unpublish.
//
// # State
//
// The proxy keeps one record per path it acted on: a publish target path (deferred or host-mounted) or a
// staging path (staged as raw block). A record is written before the first side effect of a call and
// after each step, and deleted after the last undo step. All steps and undo steps are idempotent, so after
// a crash at any instant kubelet's retry of the same call finishes it (every step is run again), and
// NodeUnpublishVolume or NodeUnstageVolume undoes whatever the record says may have been done. A record
// of an earlier boot is kept (the driver's own state may outlive a boot) and treated as incomplete: its
// mounts are gone, so the next publish runs every step again and the next unpublish undoes every step.
// (crustd drops its descriptors of an earlier boot; the proxy's records are obligations to undo, which a
// reboot does not discharge.)
//
// The records are kept by the record engine, internal/recordfile, whose package documentation is the
// contract of the state directory: the record format (version, boot id, checksum), the atomic and
// durable replace, file modes, the quarantine of a damaged record in corrupt/, the refusal to start on a
// record of a newer version, and the lock that gives the directory to one proxy at a time (a second one
// fails at start naming the first, holder "crust-csi-proxy"). What the proxy adds:
//
//	<state-dir>/records/<key>.json     one record per path
//	<state-dir>/block/<key>/dev        the private path of a target not shaped like kubelet's
//
// For a kubelet-shaped target, <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount, the private
// path is <kubelet>/pods/<uid>/volumes/kubernetes.io~csi/<name>/crust.dev~block/dev; a record names the
// private path it used, so records written before either form still undo what they did.
//
// <key> is the lowercase hex SHA-256 of "<kind>:<path>" (kind "publish" or "stage"). Records are of
// version 1; the envelope's payload member is "record", an object with the members of Record: kind,
// path, volumeId, mode ("deferred", "host" or "block-stage"), phase, stagingPath, privatePath, device,
// fsType, readOnly, updated. Phases, in order: for a publish "publishing" (written before the first step)
// and "published" (after the last); while undoing it "unpublishing"; for a stage "staging", "staged",
// "unstaging". Every step and every undo step is idempotent, so a record says no more than whether its
// call completed: a retry runs all the steps again, an undo all the undo steps. Any other phase (earlier
// versions wrote one after each step) reads as not completed. A payload that does not decode, or a file
// name that does not match its kind and path, is damage: the engine moves it to corrupt/, and the proxy
// logs at error that what it recorded may need cleaning up by hand.
//
// # Deployment
//
// The private block paths must be visible to the driver and the proxy alike, and the devices to crustd:
// kubelet's target paths are (a containerised driver mounts <kubelet>/pods with bidirectional
// propagation), and the proxy needs the host's /dev and /sys to name a device crustd accepts (with neither,
// the private node itself is deposited, which crustd's --device-allow must then admit, as it must the
// kernel's /dev name for the node's number). The driver must support raw block volumes.
package csiproxy
