// Package kubectl is kubectl-crust, the kubectl plugin `kubectl crust ls|get|doctor [--node N]`: crustctl's
// view of crustd, for one node or for every node at once, from wherever kubectl works; and `kubectl crust
// inject`, which adds crust-csi-proxy to a driver's manifests (internal/inject) and talks to no cluster.
//
// Promises: it finds the running crustd pod of each node (label app.kubernetes.io/name=crustd, in
// crust-system unless -n says otherwise), runs crustctl in it through the API server (pods/exec; it needs
// get and list on pods and create on pods/exec in that namespace, nothing else), and prints what crustctl
// prints, with the node first: a NODE column in the table forms, a "node" field in json and yaml (one
// document, {"items": [...]}). It changes nothing on any node. A node whose crustd could not be asked is
// named on stderr, with crustctl's own error, and the others are still shown; the exit status is then 1.
// `get` shows the target on whichever nodes hold it, and is NotFound (exit 1) only when none does.
// `doctor` exits 3 when any node has a problem. A usage error exits 2.
package kubectl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/version"
	"crust.dev/crust/internal/ctl"
	"crust.dev/crust/pkg/command"
)

const (
	// Namespace is where deploy/ and the chart install crustd.
	Namespace = "crust-system"
	// selector finds crustd's pods: the DaemonSet's selector, which never changes.
	selector = "app.kubernetes.io/name=crustd"
	// container is crustd's container in its pod; its image carries crustctl.
	container = "crustd"
	// parallel bounds the nodes asked at once.
	parallel = 8
)

// Exec runs cmd in crustd's container of pod and returns what it wrote. A command that exits non-zero
// returns an error carrying the status (k8s.io/client-go/util/exec.ExitError).
type Exec func(ctx context.Context, pod *corev1.Pod, cmd []string) (stdout, stderr []byte, err error)

// Connect returns the cluster's clients for the kubeconfig and context given on the command line (""
// for kubectl's defaults: $KUBECONFIG, ~/.kube/config, the current context).
type Connect func(kubeconfig, context string) (kubernetes.Interface, Exec, error)

var (
	// errProblems makes doctor exit 3.
	errProblems = errors.New("problems found")
	// errNodes makes the command exit 1 once the nodes that answered are printed.
	errNodes = errors.New("some nodes could not be asked")
)

// Main runs kubectl-crust with args against the cluster connect reaches and returns the exit status.
func Main(args []string, stdout, stderr io.Writer, connect Connect) int {
	err := command.Execute(NewCommand(connect), args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errProblems):
		return 3
	case errors.Is(err, errNodes):
		return 1
	case command.IsUsage(err):
		fmt.Fprintf(stderr, "kubectl-crust: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "kubectl-crust: %v\n", err)
	return 1
}

type options struct {
	connect              Connect
	kubeconfig, kcontext string
	namespace, node      string
	output               string
	timeout              time.Duration
}

// NewCommand returns kubectl-crust's root command.
func NewCommand(connect Connect) *cobra.Command {
	o := &options{connect: connect}
	root := &cobra.Command{
		Use:   "kubectl-crust",
		Short: "crustctl's view of crustd on one node (--node) or on every node",
		Long: `kubectl crust runs crustctl in the crustd pod of each node, through the API server, and shows
what it answers with the node first. It needs get and list on pods and create on pods/exec in crustd's
namespace. It changes nothing.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl crust"},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&o.kubeconfig, "kubeconfig", "", "the kubeconfig file (default: kubectl's: $KUBECONFIG, then ~/.kube/config)")
	pf.StringVar(&o.kcontext, "context", "", "the kubeconfig context (default: its current context)")
	pf.StringVarP(&o.namespace, "namespace", "n", Namespace, "the namespace crustd runs in")
	pf.StringVar(&o.node, "node", "", "ask this node's crustd only (default: every node's)")
	pf.StringVarP(&o.output, "output", "o", "", "output format: table, wide, json or yaml (as crustctl's, with the node)")
	pf.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long the whole command may take")
	root.AddCommand(
		&cobra.Command{
			Use: "ls", Short: "List every node's staged volumes", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return o.run(cmd, []string{"ls"}, func() proto.Message { return &crustv1.ListVolumesResponse{} })
			},
		},
		&cobra.Command{
			Use: "get TARGET", Short: "Show one volume, on whichever nodes hold it", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return o.run(cmd, []string{"get", args[0]}, func() proto.Message { return &crustv1.Volume{} })
			},
		},
		&cobra.Command{
			Use: "doctor", Short: "What each node's crustd set aside, and what to do about it (exit 3 when there is any)", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return o.run(cmd, []string{"doctor"}, func() proto.Message { return &crustv1.ListProblemsResponse{} })
			},
		},
		injectCommand(o),
		command.VersionCommand(nil),
	)
	command.SetVersion(root)
	return root
}

// answer is one node's: what crustd said, or why it could not be asked.
type answer struct {
	node     string
	msg      proto.Message
	err      error
	notFound bool // crustctl said NotFound
	problems bool // doctor's exit 3
}

// run asks every chosen node's crustd with `crustctl -o json ARGS` and prints the answers.
func (o *options) run(cmd *cobra.Command, args []string, fresh func() proto.Message) error {
	if err := ctl.CheckOutput(o.output); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	cs, exec, err := o.connect(o.kubeconfig, o.kcontext)
	if err != nil {
		return err
	}
	pods, err := o.crustdPods(ctx, cs)
	if err != nil {
		return err
	}
	answers := make([]answer, len(pods))
	var g errgroup.Group
	g.SetLimit(parallel)
	for i, p := range pods {
		g.Go(func() error {
			answers[i] = ask(ctx, exec, p, args, fresh())
			return nil
		})
	}
	_ = g.Wait()

	var shown []ctl.NodeAnswer
	failed, notFound, problems := 0, 0, false
	for _, a := range answers {
		switch {
		case a.notFound:
			notFound++
		case a.err != nil:
			failed++
			fmt.Fprintf(cmd.ErrOrStderr(), "kubectl-crust: node %s: %v\n", a.node, a.err)
		default:
			shown = append(shown, ctl.NodeAnswer{Node: a.node, Answer: a.msg})
			problems = problems || a.problems
		}
	}
	if len(shown) == 0 && notFound > 0 && failed == 0 {
		return fmt.Errorf("NotFound: no crustd holds %s (asked %d nodes)", args[len(args)-1], notFound)
	}
	if len(shown) > 0 || failed == 0 {
		if err := ctl.PrintNodes(cmd.OutOrStdout(), o.output, shown); err != nil {
			return err
		}
	}
	switch {
	case failed > 0:
		return errNodes
	case problems:
		return errProblems
	}
	return nil
}

// ask runs crustctl in pod and decodes its answer into msg.
func ask(ctx context.Context, exec Exec, pod *corev1.Pod, args []string, msg proto.Message) answer {
	a := answer{node: pod.Spec.NodeName}
	stdout, stderr, err := exec(ctx, pod, append([]string{"crustctl", "-o", "json"}, args...))
	var exit utilexec.ExitError
	if errors.As(err, &exit) && exit.ExitStatus() == 3 && args[0] == "doctor" {
		a.problems, err = true, nil
	}
	if err != nil {
		said := strings.TrimSpace(string(stderr))
		a.notFound = strings.HasPrefix(said, "crustctl: NotFound:")
		if said != "" {
			a.err = fmt.Errorf("pod %s: %s", pod.Name, said)
		} else {
			a.err = fmt.Errorf("pod %s: %w", pod.Name, err)
		}
		return a
	}
	if err := protojson.Unmarshal(stdout, msg); err != nil {
		a.err = fmt.Errorf("pod %s: crustctl's answer: %w", pod.Name, err)
		return a
	}
	a.msg = msg
	return a
}

// crustdPods returns the running crustd pod of each chosen node, sorted by node. A chosen node without
// one is an error that says where crustd runs.
func (o *options) crustdPods(ctx context.Context, cs kubernetes.Interface) ([]*corev1.Pod, error) {
	opts := metav1.ListOptions{LabelSelector: selector}
	if o.node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.node).String()
	}
	list, err := cs.CoreV1().Pods(o.namespace).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing crustd's pods in namespace %s: %w", o.namespace, err)
	}
	byNode := map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName == "" || (o.node != "" && p.Spec.NodeName != o.node) {
			continue
		}
		// During a rolling update a node has two: the one that runs, and the one that stops or starts.
		if cur, ok := byNode[p.Spec.NodeName]; !ok || (!running(cur) && running(p)) {
			byNode[p.Spec.NodeName] = p
		}
	}
	if len(byNode) == 0 {
		if o.node != "" {
			return nil, fmt.Errorf("no crustd pod on node %s in namespace %s: crustd runs on the nodes labelled crust.dev/microvm=true", o.node, o.namespace)
		}
		return nil, fmt.Errorf("no crustd pod in namespace %s: is crust installed there (-n)?", o.namespace)
	}
	pods := make([]*corev1.Pod, 0, len(byNode))
	for _, p := range byNode {
		pods = append(pods, p)
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Spec.NodeName, b.Spec.NodeName) })
	return pods, nil
}

func running(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
}

// InCluster is the Connect of the kubectl-crust binary: client-go's kubeconfig loading, as kubectl's, and
// exec over WebSocket, falling back to SPDY for API servers that do not offer it (as kubectl does).
func InCluster(kubeconfig, kcontext string) (kubernetes.Interface, Exec, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kcontext}).ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-crust/" + version.Get().Version
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	exec := func(ctx context.Context, pod *corev1.Pod, cmd []string) ([]byte, []byte, error) {
		req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
		if err != nil {
			return nil, nil, err
		}
		spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
		if err != nil {
			return nil, nil, err
		}
		ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
		if err != nil {
			return nil, nil, err
		}
		var stdout, stderr bytes.Buffer
		err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
		return stdout.Bytes(), stderr.Bytes(), err
	}
	return cs, exec, nil
}
