// Command crust-csi-proxy is the CO-mediated variant of crust: a CSI Node proxy. See internal/csiproxy.
package main

import (
	"os"

	"crust.dev/crust/internal/csiproxy"
)

func main() {
	if err := csiproxy.NewCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
