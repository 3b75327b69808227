// Command crust-microvm is crust's reference runtime handler: it boots a QEMU microVM per sandbox and
// mounts the sandbox's crust volumes inside it. See examples/microvm/vmhandler.
package main

import (
	"os"

	"crust.dev/crust/examples/microvm/vmhandler"
)

func main() { os.Exit(vmhandler.Main(os.Args[1:], os.Stdout, os.Stderr)) }
