package kubectl

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"crust.dev/crust/internal/inject"
)

// injectCommand is `kubectl crust inject`: a driver's rendered manifests in, the same with crust's proxies
// added out. It talks to no cluster.
func injectCommand(o *options) *cobra.Command {
	opts := inject.Defaults()
	file := "-"
	cmd := &cobra.Command{
		Use:   "inject [-f FILE]",
		Short: "Add crust-csi-proxy to a CSI driver's manifests (stdin or -f) and write them to stdout",
		Long: `kubectl crust inject reads a CSI driver's manifests as its project renders them (helm template,
kustomize build, or its deploy files), adds crust-csi-proxy in front of the node plugin and the controller,
and writes them to stdout. The driver's own containers are left as they were: kubelet and the controller
sidecars are pointed at the proxies, and the proxies at the driver's socket. It talks to no cluster:

  helm template my-driver CHART -n NS | kubectl crust inject -n NS | kubectl apply -f -

-n names the namespace of objects that name none (their ServiceAccount's). What it did goes to stderr; what
it cannot inject is an error naming the object, and then it writes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("namespace") {
				opts.Namespace = o.namespace
			}
			in := cmd.InOrStdin()
			if file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer func() { _ = f.Close() }()
				in = f
			}
			return runInject(in, cmd.OutOrStdout(), cmd.ErrOrStderr(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", file, `the manifests ("-": stdin)`)
	f.StringVar(&opts.Image, "image", opts.Image, "crust-csi-proxy's image")
	f.StringVar(&opts.KubeletDir, "kubelet-dir", opts.KubeletDir, "kubelet's root directory on the nodes (its --root-dir; docs/operators.md lists distributions')")
	f.StringVar(&opts.MicroVMHandlers, "microvm-handlers", opts.MicroVMHandlers, "RuntimeClass handler patterns whose pods get deferred volumes (comma-separated)")
	f.StringVar(&opts.DefaultRuntimeHandler, "default-runtime-handler", "", "the nodes' containerd default runtime, for pods that name no RuntimeClass (\"\": runc); set it where every pod runs in a microVM")
	f.Int32Var(&opts.NodePort, "node-port", opts.NodePort, "the node proxy's HTTP port (/metrics, /healthz, /readyz)")
	f.Int32Var(&opts.ControllerPort, "controller-port", opts.ControllerPort, "the controller proxy's HTTP port")
	f.BoolVar(&opts.Check, "check", false, "change nothing: fail, naming each, when a driver pod has no proxy (for manifests given the proxy by the kustomize Component), and pass the input through otherwise")
	return cmd
}

func runInject(in io.Reader, out, log io.Writer, opts inject.Options) error {
	res, err := inject.Inject(in, out, opts)
	if err != nil {
		return err
	}
	for _, s := range res.Injected {
		fmt.Fprintf(log, "injected %s\n", s)
	}
	for _, s := range res.Unchanged {
		fmt.Fprintf(log, "unchanged %s: it has its proxies already\n", s)
	}
	for _, s := range res.PodInfoSet {
		fmt.Fprintf(log, "set podInfoOnMount: true on %s: the proxy decides per pod, and kubelet names the pod only with it "+
			"(a cluster whose API server refuses the change to an existing object: delete the CSIDriver and apply it again)\n", s)
	}
	return nil
}
