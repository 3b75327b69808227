// Command crust-guest is the agent of the crust microVM: it runs as /init in
// the guest and serves the host over a virtio-serial port (see
// examples/microvm/guest). Build it static: CGO_ENABLED=0.
package main

import (
	"fmt"
	"os"

	"crust.dev/crust/examples/microvm/guest"
)

func main() {
	err := guest.Run() // returns only when the guest could not be set up
	fmt.Fprintln(os.Stderr, "crust-guest:", err)
	if os.Getpid() == 1 {
		guest.PowerOff()
	}
	os.Exit(1)
}
