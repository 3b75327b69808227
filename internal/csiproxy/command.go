package csiproxy

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"crust.dev/crust/pkg/command"
)

// NewCommand returns the crust-csi-proxy command.
func NewCommand() *cobra.Command {
	cfg := Defaults()
	cmd := command.Server("crust-csi-proxy",
		"CSI Node proxy in front of an unmodified driver: defers block volumes' filesystems to microVM runtimes through crustd",
		func(ctx context.Context, _ *cobra.Command, log *slog.Logger) error {
			if cfg.NodeName == "" {
				cfg.NodeName = os.Getenv("NODE_NAME")
			}
			klog.SetSlogLogger(log) // k8s.io/mount-utils and client-go log through klog
			return Run(ctx, cfg, log, Deps{})
		})
	f := cmd.Flags()
	f.BoolVar(&cfg.Controller, "controller", false, "serve Identity and Controller in front of the driver's controller socket (the one external-provisioner and external-resizer dial), instead of Identity and Node")
	f.StringVar(&cfg.CSIAddress, "csi-address", "", "unix socket to serve CSI on (the one kubelet dials, or with --controller the sidecars)")
	f.StringVar(&cfg.DriverAddress, "driver-address", "", "unix socket of the CSI driver behind the proxy")
	command.AddSocketFlag(f, &cfg.CrustSocket, cfg.CrustSocket, "crustd's API socket")
	f.StringSliceVar(&cfg.MicroVMHandlers, "microvm-handlers", nil, "RuntimeClass handlers whose pods get deferred volumes: comma-separated path.Match patterns, such as kata,kata-*,crust-microvm (with --kubeconfig)")
	f.StringVar(&cfg.DefaultHandler, "default-runtime-handler", "", "the runtime handler of pods that name no RuntimeClass: the node's containerd default runtime (\"\": runc); with --kubeconfig, a pod without a RuntimeClass gets deferred volumes when it matches --microvm-handlers")
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig for pod and RuntimeClass look-ups (\"in-cluster\": the pod's service account); without it every volume whose context asks for deferral is deferred")
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory of the proxy's crash-safe records and private block paths")
	f.StringVar(&cfg.StageKeyDir, "stage-key-dir", "", "directory on tmpfs that keeps the encryption keys of NodeStageVolume's secrets across restarts until unstage (\"\": <crust socket's directory>/csi-proxy-keys/<hash of --state-dir>); not on tmpfs, keys are kept in memory only")
	f.StringVar(&cfg.KubeletDir, "kubelet-dir", cfg.KubeletDir, "kubelet's root directory, which holds the quarantine (crust-quarantine)")
	f.DurationVar(&cfg.QuarantineMaxAge, "quarantine-max-age", cfg.QuarantineMaxAge, "how long a target quarantined at unpublish (data a runtime wrote on the node's disk) is kept before it is deleted (0: no bound)")
	f.Int64Var(&cfg.QuarantineMaxBytes, "quarantine-max-bytes", cfg.QuarantineMaxBytes, "the most bytes the quarantine holds: past it, the oldest quarantined targets are deleted (0: no bound)")
	f.StringVar(&cfg.NodeName, "node-name", "", "this node's name, for the pod informer (default $NODE_NAME)")
	f.DurationVar(&cfg.PodWait, "pod-wait", cfg.PodWait, "how long a publish waits for its pod to appear in the cache before UNAVAILABLE")
	f.DurationVar(&cfg.LockWait, "lock-wait", cfg.LockWait, "how long a call waits for another on the same path before ABORTED")
	f.BoolVar(&cfg.GuardTargets, "guard-deferred-targets", cfg.GuardTargets, "mount an empty read-only tmpfs on a deferred volume's target path (for a pod with no subPath, with --kubeconfig), so that a runtime that does not claim the volume from crustd fails to write instead of writing to the node's disk")
	f.DurationVar(&cfg.UnconsumedInterval, "unconsumed-check-interval", cfg.UnconsumedInterval, "how often to look for deferred volumes that no sandbox has claimed while their pod runs (VolumeNotConsumed events, crust_csi_proxy_unconsumed_volumes; with --kubeconfig; 0 disables)")
	f.DurationVar(&cfg.UnconsumedGrace, "unconsumed-grace", cfg.UnconsumedGrace, "how long after its publish a deferred volume may stay unclaimed while its pod runs before it is reported")
	f.StringVar(&cfg.HTTPAddr, "http-addr", "", `address for /metrics, /healthz and /readyz, such as 127.0.0.1:9810 ("" disables)`)
	cfg.MetricsSecure.AddFlags(f)
	_ = cmd.MarkFlagRequired("csi-address")
	_ = cmd.MarkFlagRequired("driver-address")
	return cmd
}
