// Command crustctl is crust's operator and script CLI. See internal/ctl.
package main

import (
	"os"

	"crust.dev/crust/internal/ctl"
)

func main() { os.Exit(ctl.Main(os.Args[1:], os.Stdout, os.Stderr)) }
