// Package agentproto is the contract between the host side of the crust
// microVM and crust-guest, the agent that runs as /init inside it: the name of
// the virtio-serial port they talk over, the places in the guest image the
// agent reads at boot, and the request/response protocol with a client and a
// server for it.
//
// # Transport
//
// The VM has a virtio-serial port named PortName. The guest opens it as
// /dev/vportNpM; the host reaches it through a unix-socket chardev. Both
// directions carry UTF-8 JSON documents, exactly one per line, each ending in
// '\n'. A line longer than MaxLineBytes (newline included) is refused and
// skipped up to its end; the reader then goes on with the next line.
//
// # Requests and responses
//
// A request is
//
//	{"id": 7, "op": "mount", "args": {...}}
//
// id is chosen by the host, non-zero, and echoed in the response; op names
// the operation; args is the operation's argument object (absent when it has
// none). A response is either
//
//	{"id": 7, "result": {...}}
//	{"id": 7, "error": {"code": "not_found", "message": "..."}}
//
// Requests are served concurrently, so responses may come back in any order.
// A line that is not a request gets a response with id 0 and code
// invalid_argument. Unknown fields are ignored in both directions, so either
// side may add optional fields. Byte strings (exec's output) are base64, as
// encoding/json writes []byte.
//
// # Operations
//
//   - ping: no args; result PingResult. The host pings until the agent
//     answers to learn that the guest is up.
//   - mount: MountArgs; result MountResult. Waits (up to a bound) for the
//     virtio-blk disk whose serial is args.serial, formats it when
//     create_filesystem is set and it carries no signature, mounts it on
//     target, grows the filesystem (read-write ext2/3/4 and xfs) to fill the
//     disk when the disk is more than one block larger, and applies fs_group.
//     Mounting the same disk on the same target again succeeds without doing
//     anything. With block set it mounts nothing: it makes a block device
//     node of the disk at target (a raw block volume); the same node there
//     again succeeds, anything else there is failed_precondition.
//   - unmount: UnmountArgs; empty result. Unmounting a target that is not
//     mounted succeeds. For a raw block volume it removes the node.
//   - statfs: StatfsArgs; result StatfsResult: bytes and inodes, and whether
//     the volume is abnormal (device gone, or read-only though mounted
//     read-write). not_found when nothing is mounted on target. For a raw
//     block volume: the disk's size as bytes.total, nothing else.
//   - grow: GrowArgs; result GrowResult. Waits until the disk reports at
//     least min_device_bytes, then grows the mounted filesystem online
//     (resize2fs for ext2/3/4, xfs_growfs for xfs). For a raw block volume
//     there is no filesystem: the capacity is the disk's size.
//   - exec: ExecArgs; result ExecResult. Runs argv with a timeout.
//   - shutdown: no args; empty result. The agent answers, unmounts what it
//     mounted, syncs and powers the VM off.
//
// Error codes are the Code constants.
package agentproto

// PortName is the name of the virtio-serial port the agent serves on
// (QEMU's virtserialport name=..., /sys/class/virtio-ports/*/name in the guest).
const PortName = "org.crust.agent"

// ModulesDir is the directory of the guest image holding the kernel modules
// the agent loads at boot.
const ModulesDir = "/lib/modules/crust"

// ModuleList is the file of the guest image naming the files of ModulesDir,
// one a line, in the order the agent loads them.
const ModuleList = "/etc/crust/modules.load"

// MaxLineBytes bounds one line of the protocol, newline included.
const MaxLineBytes = 1 << 20

// MaxExecOutput bounds each of exec's stdout and stderr; the agent keeps the
// first MaxExecOutput bytes and reports truncation. Two of them, base64, fit
// in one line.
const MaxExecOutput = 256 << 10
