// Command crust-test-registrar registers a CSI driver with kubelet for crust's cluster tests; it takes
// node-driver-registrar's flags. See test/cluster/registrar.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"crust.dev/crust/test/cluster/registrar"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(registrar.Main(ctx, os.Args[1:], os.Stderr))
}
