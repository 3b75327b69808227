// Command dataload runs one workload of the data-path benchmark and prints its result as JSON (see
// package crust.dev/crust/test/bench/dataload).
package main

import (
	"os"

	"crust.dev/crust/test/bench/dataload"
)

func main() { os.Exit(dataload.Main(os.Args[1:], os.Stdout, os.Stderr)) }
