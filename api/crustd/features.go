package crustd

import (
	"path/filepath"
	"strings"
)

// The names of the features crustd serves, as InfoService's GetInfo lists them (GetInfoResponse.features,
// whose documentation in crust.proto says what each one promises). A name is never reused for another
// meaning. Test for one with slices.Contains(info.GetFeatures(), name).
const (
	// FeatureWatchResume: WatchVolumes resumes after a revision (since_revision), and revisions survive a
	// restart of crustd.
	FeatureWatchResume = "watch-resume"
	// FeatureHandlerSocketCheck: ClaimVolume refuses a handler endpoint whose socket crustd cannot see.
	FeatureHandlerSocketCheck = "handler-socket-check"
	// FeatureHostMountCheck: a device the host has mounted is neither staged nor claimed.
	FeatureHostMountCheck = "host-mount-check"
	// FeatureRawBlock: raw block descriptors (VOLUME_MODE_BLOCK) are accepted.
	FeatureRawBlock = "raw-block"
	// FeatureIOLimits: I/O limits (VolumeSpec.io_limits) are accepted and handed to the handler.
	FeatureIOLimits = "io-limits"
	// FeaturePmem: persistent-memory descriptors (VOLUME_TYPE_PMEM) are accepted.
	FeaturePmem = "pmem"
	// FeatureFileBacked: image-file descriptors (VOLUME_TYPE_FILE) are accepted (crustd --allow-file-backed).
	FeatureFileBacked = "file-backed"
	// FeatureExpandUnclaimed: an expansion before any claim is recorded for the handler that claims next.
	FeatureExpandUnclaimed = "expand-unclaimed"
	// FeatureKataProjection: descriptors are written for an unmodified Kata runtime (crustd --kata-dir).
	FeatureKataProjection = "kata-projection"
	// FeatureKataCRIDiscovery: the Kata sandbox of a volume is found through the CRI runtime (crustd
	// --cri-endpoint).
	FeatureKataCRIDiscovery = "kata-cri-discovery"
	// FeatureNodeHolds: the node's holds on devices (HoldForNode, ReleaseFromNode, ListNodeHolds) are
	// served and count for the one-writer rule, and a deposit of a device a sandbox holds through another
	// target is refused.
	FeatureNodeHolds = "node-holds"
	// FeatureRawDeviceCheck: CheckRawDevice says whether a host block device may go raw into a sandbox.
	FeatureRawDeviceCheck = "raw-device-check"
	// FeatureHandlerGoneRelease: the claims of a handler gone are released (crustd --handler-grace).
	FeatureHandlerGoneRelease = "handler-gone-release"
)

// HandlerSocketDir is the subdirectory, beside crustd's socket, where runtime handlers keep the sockets
// they claim with (handler_endpoint): crustd always sees the directory it serves in, so a socket there is
// one crustd can dial, whatever directories its pod mounts besides. With the default socket it is
// /run/crust/handlers.
const HandlerSocketDir = "handlers"

// HandlerSocket returns where a runtime handler called name keeps its socket so that the crustd serving
// at socket (a path, or a unix:// address) sees it: <socket's directory>/handlers/<name>.sock, such as
// /run/crust/handlers/myshim.sock for the default socket.
func HandlerSocket(socket, name string) string {
	socket = strings.TrimPrefix(strings.TrimPrefix(socket, "unix://"), "unix:")
	return filepath.Join(filepath.Dir(socket), HandlerSocketDir, name+".sock")
}
