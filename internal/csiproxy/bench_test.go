package csiproxy

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"crust.dev/crust/internal/testutil/sandbox"
)

// BenchmarkProxyOverhead runs the same calls side by side straight to the reference driver and through the
// proxy (in this process, over its unix socket, logging through its interceptor into a discarding
// handler): NodePublishVolume of an already published volume (the pass-through path; the driver checks its
// mounts and answers) and NodeGetVolumeStats of it (the driver's statfs); both cost the reference driver
// tens of milliseconds (it asks LVM each time), so NodeGetCapabilities, answered from memory, shows the
// hop's own cost. Each proxy sub-benchmark reports x-direct, its time per call over the direct one's. NodeGetVolumeStats/deferred is a deferred volume's
// stats, proxy to crustd to the sandbox's handler, for scale.
func BenchmarkProxyOverhead(b *testing.B) {
	e := newEnv(b)
	proxyConn := startProxy(b, e.config(), e.log)
	direct, proxied := csi.NewNodeClient(e.driverConn), csi.NewNodeClient(proxyConn)
	ctx := context.Background()

	vol := e.createVolume("pvc-bench", 64<<20, false)
	staging, target := e.staging("pv-bench"), e.target("0e0e0e0e-0000-4000-8000-0000000000b1", "pv-bench")
	stageAndPublish(b, direct, vol, staging, target)
	pub := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
		VolumeCapability: mountCap(), VolumeContext: vol.GetVolumeContext()}
	b.Cleanup(func() {
		_, _ = direct.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
		_, _ = direct.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
	})
	stats := &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: target}

	pair := func(name string, call func(csi.NodeClient) error) {
		var directPerOp time.Duration
		b.Run(name+"/direct", func(b *testing.B) {
			for b.Loop() {
				if err := call(direct); err != nil {
					b.Fatal(err)
				}
			}
			directPerOp = b.Elapsed() / time.Duration(b.N)
		})
		b.Run(name+"/proxy", func(b *testing.B) {
			for b.Loop() {
				if err := call(proxied); err != nil {
					b.Fatal(err)
				}
			}
			if directPerOp > 0 {
				b.ReportMetric(float64(b.Elapsed()/time.Duration(b.N))/float64(directPerOp), "x-direct")
			}
		})
	}
	pair("NodeGetCapabilities", func(n csi.NodeClient) error {
		_, err := n.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		return err
	})
	pair("NodePublishVolume", func(n csi.NodeClient) error { _, err := n.NodePublishVolume(ctx, pub); return err })
	pair("NodeGetVolumeStats", func(n csi.NodeClient) error { _, err := n.NodeGetVolumeStats(ctx, stats); return err })

	// A deferred volume's stats: the proxy asks crustd, which asks the sandbox's handler.
	dvol := e.createVolume("pvc-bench-deferred", 64<<20, true)
	dstaging, dtarget := e.staging("pv-bench-d"), e.target("0e0e0e0e-0000-4000-8000-0000000000b2", "pv-bench-d")
	stageAndPublish(b, proxied, dvol, dstaging, dtarget)
	sb := sandbox.New(b, e.crustSock, "bench-sandbox")
	sb.Start(dtarget)
	b.Cleanup(func() {
		sb.Stop(dtarget)
		_, _ = proxied.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: dvol.GetVolumeId(), TargetPath: dtarget})
		_, _ = proxied.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: dvol.GetVolumeId(), StagingTargetPath: dstaging})
	})
	dstats := &csi.NodeGetVolumeStatsRequest{VolumeId: dvol.GetVolumeId(), VolumePath: dtarget}
	b.Run("NodeGetVolumeStats/deferred", func(b *testing.B) {
		for b.Loop() {
			if _, err := proxied.NodeGetVolumeStats(ctx, dstats); err != nil {
				b.Fatal(err)
			}
		}
	})
}
