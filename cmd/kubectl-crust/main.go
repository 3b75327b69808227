// Command kubectl-crust is the kubectl plugin `kubectl crust`: crustctl's view of every node's crustd. See
// internal/ctl/kubectl.
package main

import (
	"os"

	"crust.dev/crust/internal/ctl/kubectl"
)

func main() { os.Exit(kubectl.Main(os.Args[1:], os.Stdout, os.Stderr, kubectl.InCluster)) }
