// Command crust-lvm-csi runs crust's reference CSI driver (package lvmdriver) as a process: the binary of
// the crust/crust-lvm-csi image that deploy/examples deploys, and of the test tiers that run the driver
// out of process. It serves until SIGINT or SIGTERM.
//
//	crust-lvm-csi --endpoint /run/crust-lvm-csi/csi.sock --vg VG [--pv /dev/loop3]... [--crust-socket /run/crust/crust.sock]
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"crust.dev/crust/examples/lvm-csi/lvmdriver"
	"crust.dev/crust/pkg/command"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var cfg lvmdriver.Config
	var endpoint string
	cmd := command.Server("crust-lvm-csi", "crust's reference CSI driver: LVM volumes, deferred to microVM runtimes through crustd",
		func(ctx context.Context, _ *cobra.Command, log *slog.Logger) error {
			cfg.Log = log
			stop, err := lvmdriver.Start(endpoint, cfg)
			if err != nil {
				return err
			}
			<-ctx.Done()
			return stop()
		})
	f := cmd.Flags()
	f.StringVar(&endpoint, "endpoint", "/run/crust-lvm-csi/csi.sock", "unix socket to serve CSI on")
	f.StringVar(&cfg.VG, "vg", "", "volume group of the volumes (required)")
	f.StringArrayVar(&cfg.Devices, "pv", nil, "physical volume of the group, the only devices LVM looks at (repeatable; none: LVM's own scan)")
	// Deferral is off unless the socket is named, by the flag or by the environment.
	command.AddSocketFlag(f, &cfg.CrustSocket, "", `crustd's socket; "" turns deferral off`)
	f.StringVar(&cfg.Name, "name", lvmdriver.DefaultName, "CSI plugin name")
	f.StringVar(&cfg.NodeID, "node-id", "", "node id (default: the host name)")
	f.StringVar(&cfg.StateDir, "state-dir", "", "private directory (default: a temporary one)")
	f.StringVar((*string)(&cfg.Activation), "activation", "", `"device-mapper", "extent-map", or "" to pick`)
	f.StringVar(&cfg.DefaultFSType, "default-fs-type", "ext4", "filesystem of a mount volume that names none")
	f.BoolVar(&cfg.NoVolumeContext, "no-volume-context", false, "return no volume context from CreateVolume, as most drivers do")
	f.BoolVar(&cfg.StrictAccessType, "strict-access-type", false, "refuse to publish as raw block a volume created for filesystem use")
	f.BoolVar(&cfg.Capacity, "capacity", false, "report the node as topology and the volume group's free space through GetCapacity (storage capacity tracking)")
	return cmd
}
