// Command crustd is crust's node daemon. See internal/daemon.
package main

import (
	"os"

	"crust.dev/crust/internal/daemon"
)

func main() {
	if err := daemon.NewCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
