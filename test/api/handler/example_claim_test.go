package handler_test

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/handler"
)

// guest answers crustd's forwarded calls for the volumes its sandbox holds; a real handler measures the
// filesystem inside the VM (examples/microvm asks its guest agent).
type guest struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer
}

func (guest) GetVolumeStats(context.Context, *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	return &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Unit: crustv1.VolumeUsage_UNIT_BYTES, Total: 60 << 20, Used: 12 << 20, Available: 48 << 20},
	}}, nil
}

// A runtime handler serves RuntimeHandlerService, claims a deferred volume for its sandbox, attaches and
// mounts what the descriptor says, and releases it when the sandbox is done. While it holds the claim,
// crustd answers the CSI driver's NodeGetVolumeStats with what the handler measured in the sandbox.
func Example_claim() {
	ctx := context.Background()
	target, driver, err := deposit("pv-1") // the CSI driver's part, at NodePublishVolume
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = driver.Close() }()

	c, err := handler.Dial(socket)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = c.Close() }()
	// The handler's socket lies beside crustd's, where crustd sees it whatever its pod mounts.
	stop, endpoint, err := handler.ServeHandler(crustd.HandlerSocket(socket, "example"), guest{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	// A container of sandbox-1 mounts the target path: claim it, then attach and mount what it says.
	v, err := c.Claim(ctx, target, "sandbox-1", endpoint)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("attach", filepath.Base(v.GetResolvedBackingPath()), "and mount it as", v.GetSpec().GetFsType(),
		"read-only", v.GetSpec().GetReadOnly())

	// kubelet asks the driver for stats; the driver asks crustd, which asks the handler.
	st, err := driver.Stats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "pv-1", VolumePath: target})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, u := range st.GetUsage() {
		fmt.Println("stats from the sandbox:", u.GetUnit(), "used", u.GetUsed()>>20, "MiB of", u.GetTotal()>>20)
	}

	// Another sandbox may not write the same device while sandbox-1 holds it.
	if _, err := c.Claim(ctx, target, "sandbox-2", endpoint); err != nil {
		fmt.Println("sandbox-2 refused")
	}

	// The sandbox is done: unmount and detach, then release.
	if err := c.Release(ctx, target, "sandbox-1"); err != nil {
		fmt.Println(err)
		return
	}
	v, _ = c.Get(ctx, target)
	fmt.Println("claimed after release:", v.GetClaim() != nil)
	// Output:
	// attach pv-1.img and mount it as ext4 read-only false
	// stats from the sandbox: BYTES used 12 MiB of 60
	// sandbox-2 refused
	// claimed after release: false
}
