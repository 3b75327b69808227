// Command containerd-shim-crust-microvm-v1 is crust-microvm as a containerd runtime v2 shim (runtime_type
// io.containerd.crust-microvm.v1): see package shim.
package main

import "crust.dev/crust/examples/microvm/shim"

func main() { shim.Run() }
