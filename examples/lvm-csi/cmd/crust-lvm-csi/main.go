// Command crust-lvm-csi runs crust's reference CSI driver (package csidriver) as a process: the binary of
// the crust/crust-lvm-csi image that deploy/examples deploys, and of the test tiers that run the driver
// out of process. It serves until SIGINT or SIGTERM.
//
//	crust-lvm-csi --endpoint /run/crust-lvm-csi/csi.sock --vg VG [--pv /dev/loop3]... [--crust-socket /run/crust/crust.sock]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	csidriver "crust.dev/crust/examples/lvm-csi"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var cfg csidriver.Config
	var pvs list
	endpoint := flag.String("endpoint", "/run/crust-lvm-csi/csi.sock", "unix socket to serve CSI on")
	flag.StringVar(&cfg.VG, "vg", "", "volume group of the volumes (required)")
	flag.Var(&pvs, "pv", "physical volume of the group, the only devices LVM looks at (repeatable; none: LVM's own scan)")
	flag.StringVar(&cfg.CrustSocket, "crust-socket", "", `crustd's socket; "" turns deferral off`)
	flag.StringVar(&cfg.Name, "name", csidriver.DefaultName, "CSI plugin name")
	flag.StringVar(&cfg.NodeID, "node-id", "", "node id (default: the host name)")
	flag.StringVar(&cfg.StateDir, "state-dir", "", "private directory (default: a temporary one)")
	flag.StringVar((*string)(&cfg.Activation), "activation", "", `"device-mapper", "extent-map", or "" to pick`)
	flag.StringVar(&cfg.DefaultFSType, "default-fs-type", "ext4", "filesystem of a mount volume that names none")
	flag.BoolVar(&cfg.NoVolumeContext, "no-volume-context", false, "return no volume context from CreateVolume, as most drivers do")
	flag.BoolVar(&cfg.StrictAccessType, "strict-access-type", false, "refuse to publish as raw block a volume created for filesystem use")
	flag.BoolVar(&cfg.Capacity, "capacity", false, "report the node as topology and the volume group's free space through GetCapacity (storage capacity tracking)")
	level := flag.String("log-level", "info", "debug, info, warn or error")
	flag.Parse()
	cfg.Devices = pvs
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "crust-lvm-csi: --log-level:", err)
		os.Exit(2)
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	stop, err := csidriver.Start(*endpoint, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crust-lvm-csi:", err)
		os.Exit(1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	<-ctx.Done()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "crust-lvm-csi: stop:", err)
		os.Exit(1)
	}
}
