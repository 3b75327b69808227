// Command mkinitramfs writes the crust guest's initramfs from the assets
// hack/guest/fetch-kernel.sh gathered and a static crust-guest binary:
//
//	go run ./examples/microvm/hack/mkinitramfs -assets _output/guest -flavour cloud \
//		-agent _output/guest/crust-guest -o _output/guest/initramfs-cloud.cpio
package main

import (
	"flag"
	"fmt"
	"os"

	"crust.dev/crust/examples/microvm/initramfs"
)

func main() {
	assets := flag.String("assets", "_output/guest", "directory fetch-kernel.sh filled")
	flavour := flag.String("flavour", "cloud", "kernel flavour: cloud, or generic (fetched with --with-9p)")
	agent := flag.String("agent", "", "static crust-guest binary (required)")
	out := flag.String("o", "", "initramfs to write (default ASSETS/initramfs-FLAVOUR.cpio)")
	flag.Parse()
	if *agent == "" {
		fmt.Fprintln(os.Stderr, "mkinitramfs: -agent is required")
		os.Exit(2)
	}
	if *out == "" {
		*out = fmt.Sprintf("%s/initramfs-%s.cpio", *assets, *flavour)
	}
	a, err := initramfs.LoadAssets(*assets, *flavour)
	if err == nil {
		err = initramfs.Guest{Agent: *agent, Modules: a.Modules, Tools: a.Tools}.WriteFile(*out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkinitramfs:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}
