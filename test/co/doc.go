// Package co is a container orchestrator simulator for tests: one Kubernetes node's kubelet, the CSI
// controller sidecars (external-provisioner, -attacher, -resizer) and the slice of the API server that
// node-local components watch. It drives any CSI driver over its sockets exactly in the order and with
// the paths and fields kubelet uses, then "starts the runtime" of a pod, so that a test sees a volume
// from CreateVolume to the data a workload wrote, without a cluster. It is not shipped.
//
// It reproduces these behaviours (facts about Kubernetes, not its code):
//
// Registration (node-driver-registrar and kubelet, external-provisioner): GetPluginInfo gives the
// driver's name, then NodeGetInfo its node id; the controller side waits for Probe to report ready, then
// reads GetPluginCapabilities and ControllerGetCapabilities. Before each node operation kubelet asks
// NodeGetCapabilities again and acts on it.
//
// Provisioning (external-provisioner): CreateVolume is named "pvc-<claim UID>" (the PV takes that name),
// asks the claim's size as required_bytes with no limit, and carries one mount capability: the
// StorageClass parameter csi.storage.k8s.io/fstype as fs_type, the StorageClass mountOptions as
// mount_flags, the claim's access mode. Parameters with the reserved prefix csi.storage.k8s.io/ are
// removed; with extra-create-metadata, csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name are added.
// The PV's volume attributes are the response's volume_context plus
// storage.kubernetes.io/csiProvisionerIdentity ("<ms>-<n>-<driver>"), and its capacity the response's.
// DeleteVolume is called with the volume id when the volume is deleted (reclaim policy Delete).
//
// Attach (attach/detach controller and external-attacher): ControllerPublishVolume is called once per
// volume and node, before staging, only when the controller advertises PUBLISH_UNPUBLISH_VOLUME (node id
// from NodeGetInfo, the capability, the volume context); its publish_context goes to NodeStageVolume and
// NodePublishVolume. ControllerUnpublishVolume follows the last NodeUnstageVolume on the node.
//
// Mount (kubelet): with STAGE_UNSTAGE_VOLUME, a volume is staged once per node at
// <kubelet>/plugins/kubernetes.io/csi/<driver>/<sha256 hex of the volume handle>/globalmount (the CO makes
// the directory and writes vol_data.json next to it) with the PV's volume attributes as volume_context;
// each pod then gets NodePublishVolume at <kubelet>/pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount,
// whose parent the CO makes (with vol_data.json) and whose creation is the driver's, with staging_target_path
// set (empty without STAGE_UNSTAGE_VOLUME), readonly from the pod's volume, and a volume_context of the
// attributes plus, when the CSIDriver has podInfoOnMount, csi.storage.k8s.io/pod.name, pod.namespace,
// pod.uid, serviceAccount.name ("default" when the pod names none) and ephemeral ("false": persistent
// volumes only). Stage and publish retry a call that fails with UNAVAILABLE, ABORTED or
// DEADLINE_EXCEEDED (kubelet retries every failure with backoff; the simulator retries only these so that
// other failures surface at once).
//
// fsGroup (kubelet): when the driver has VOLUME_MOUNT_GROUP, the pod's fsGroup is passed as
// volume_mount_group in NodeStageVolume and NodePublishVolume and kubelet changes nothing itself;
// otherwise, after NodePublishVolume, kubelet gives the group every file under the target path (group
// rw, setgid directories) when the CSIDriver's fsGroupPolicy allows it: File always,
// ReadWriteOnceWithFSType (the default) only for an fs type and a single-node-writer access mode, None
// never; nor for a read-only publish.
//
// Runtime (kubelet, CRI): volumes are published before the pod's sandbox starts. A pod runs under the
// runtime handler of its RuntimeClass ("runc" without one). Stopping a pod stops the runtime first, then
// NodeUnpublishVolume for each volume (after which kubelet removes the target path, which must not be a
// mount point, vol_data.json and the volume directory), then NodeUnstageVolume for each volume no other
// pod on the node uses (the globalmount directory and vol_data.json are then removed), then detach, then
// the pod's directory; the pod object leaves the API server last.
//
// Stats (kubelet's volume stats collector): NodeGetVolumeStats with the publish target path as
// volume_path and an empty staging_target_path, when the node advertises GET_VOLUME_STATS.
//
// Expansion (external-resizer, then kubelet): ControllerExpandVolume with the new size as required_bytes
// and the volume's capability when the controller advertises EXPAND_VOLUME; the PV's capacity becomes the
// response's. When the response asks for node expansion (or the controller cannot expand) and the node
// advertises EXPAND_VOLUME, NodeExpandVolume runs once per node, online, on the target path of one pod
// that has the volume published, with the staging path, the capability and the new capacity as
// required_bytes; a volume published nowhere is expanded on the node right after its next publish.
//
// Runtimes: MicroVM runs crust-microvm (crust's reference microVM handler) with each volume's target path
// at its container path and returns once every volume is mounted in the guest; Host stands for runc,
// which bind-mounts the target paths into the container, and so insists that each target path holds a
// mounted filesystem on the host (an empty directory there, as a deferred volume leaves, would be an
// empty volume in the container). APIServer serves pods and RuntimeClasses to components that watch them
// (crust-csi-proxy's --kubeconfig).
//
// Not reproduced: block volumes (volumeMode: Block), CSI ephemeral inline volumes, secrets, service
// account token requests, SELinux mount contexts, topology, the ReadWriteOncePod and multi-writer access
// modes, volume health monitoring, kubelet's periodic reconciliation (calls happen when the test asks),
// a kubelet restart, and more than one node.
package co
