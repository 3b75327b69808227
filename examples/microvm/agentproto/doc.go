// Package agentproto is the contract between the host side of the crust microVM and crust-guest, the
// agent that runs as /init inside it: the name of the virtio-serial port they talk over, the places in
// the guest image the agent reads at boot, and the transport of the agent's API (crust.agent.v1, in
// proto/, generated into agentv1) over that port, with its client and server set-up and the one
// conversion of errors to and from the wire.
//
// # Transport
//
// The VM has a virtio-serial port named PortName. The guest opens it as /dev/vportNpM; the host reaches
// it through QEMU's unix-socket chardev. The agent's AgentService is served over ttrpc on it. The port
// is a character device that outlives the host's connections, so ttrpc's stream is carried in
// checksummed frames tagged with a session: each host connection opens a new session (DialPort), the
// guest serves each session as one connection (ListenPort), and whatever an earlier connection left in
// the port, in either direction and up to half a frame, is dropped. The host learns that the agent is up
// when it accepts the session: no polling.
//
// # Errors
//
// Calls fail with gRPC status on the wire and errdefs kinds on either side (ToGRPC, FromGRPC; see
// errors.go for the codes). The agent answers INVALID_ARGUMENT for a malformed request, NOT_FOUND for a
// disk, target or command that does not exist, FAILED_PRECONDITION when the state does not allow the
// operation, DEADLINE_EXCEEDED when one of its bounded waits ran out, UNIMPLEMENTED for an fs type it
// does not know.
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

// MaxExecOutput bounds each of exec's stdout and stderr; the agent keeps the
// first MaxExecOutput bytes and reports truncation.
const MaxExecOutput = 256 << 10
