// Command crust-guest is the agent of the crust microVM: it runs as /init in
// the guest and serves the host over a virtio-serial port (see
// examples/microvm/guest). Build it static: CGO_ENABLED=0.
package main

import (
	"fmt"
	"os"

	"crust.dev/crust/api/version"
	"crust.dev/crust/examples/microvm/guest"
)

func main() {
	guest.RunContainerInit() // returns unless started as a container's init by the agent itself
	// The kernel hands /init no flags; --version is for the host, before the binary goes into an
	// initramfs. (No CLI library: the guest binary stays small.)
	if len(os.Args) == 2 && os.Args[1] == "--version" && os.Getpid() != 1 {
		fmt.Println("crust-guest version " + version.Get().String())
		return
	}
	err := guest.Run() // returns only when the guest could not be set up
	fmt.Fprintln(os.Stderr, "crust-guest:", err)
	if os.Getpid() == 1 {
		guest.PowerOff()
	}
	os.Exit(1)
}
