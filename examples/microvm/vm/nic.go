package vm

import (
	"fmt"
	"net"
	"os"
)

// NIC is a network card of the guest (virtio-net), present from boot, backed by a tap device the caller
// opened (podnet.Connect gives one in the pod's network namespace). QEMU gets the tap's file, so it need
// not run in that namespace; the caller keeps the file and closes it once the VM is gone.
type NIC struct {
	// Tap is the tap device's file (IFF_TAP|IFF_NO_PI; IFF_VNET_HDR is detected by QEMU).
	Tap *os.File
	// MAC is the card's hardware address.
	MAC net.HardwareAddr
}

// Names of the QEMU objects of the NICs.
const (
	netdevPrefix = "crust-net"
	nicPrefix    = "crust-nic"
)

// checkNICs validates the NICs.
func (c *Config) checkNICs() error {
	for i, n := range c.NICs {
		if n.Tap == nil {
			return fmt.Errorf("vm: NIC %d: no tap", i)
		}
		if len(n.MAC) != 6 {
			return fmt.Errorf("vm: NIC %d: MAC %q is not a 6-byte hardware address", i, n.MAC)
		}
	}
	return nil
}

// nicArgs are QEMU's arguments for the NICs; NIC i's tap is QEMU's file descriptor firstNICFd+i.
func (c *Config) nicArgs() []string {
	var args []string
	for i, n := range c.NICs {
		args = append(args,
			"-netdev", fmt.Sprintf("tap,id=%s%d,fd=%d", netdevPrefix, i, firstNICFd+i),
			"-device", fmt.Sprintf("virtio-net-pci,id=%s%d,netdev=%s%d,mac=%s", nicPrefix, i, netdevPrefix, i, n.MAC))
	}
	return args
}

// firstNICFd is the descriptor of the first NIC's tap in QEMU: the first of exec.Cmd's ExtraFiles.
const firstNICFd = 3

// nicFiles are the files QEMU inherits for the NICs, in ExtraFiles order.
func (c *Config) nicFiles() []*os.File {
	files := make([]*os.File, len(c.NICs))
	for i, n := range c.NICs {
		files[i] = n.Tap
	}
	return files
}
