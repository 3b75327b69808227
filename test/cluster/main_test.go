// Package cluster is crust's real-cluster tier: a single-node Kubernetes (hack/cluster/up.sh: the real
// kube-apiserver, controller-manager, scheduler and kubelet, etcd, containerd and runc) with crust deployed
// from deploy/ and the example driver from deploy/examples, driven with client-go. Pods of the microVM
// RuntimeClass (crust-microvm) run in QEMU guests through crust's containerd shim
// (containerd-shim-crust-microvm-v1), which claims their deferred volumes and mounts them in the guest;
// the tests look at them from inside the containers. Kata cannot run here: the kata RuntimeClass's pods
// run with runc, and the tests that need Kata play its shim.
//
// TestMain brings the cluster up (make cluster-up) unless one is up already, and takes it down at the
// end unless it found it up or CRUST_KEEP_CLUSTER is set. It needs root.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"crust.dev/crust/internal/testutil/harness"
)

// cluster is what the tests reach the running cluster through.
type cluster struct {
	root       string // the module root
	run        string // hack/cluster's $RUN
	kubeconfig string
	kubectl    string
	node       string
	nsPID      int // holds the node's mount namespace
	cs         *kubernetes.Clientset
	binDir     string // kubectl-crust, built from this tree
}

var (
	cl       *cluster
	setupErr error
)

func TestMain(m *testing.M) {
	harness.RootMain(m, "cluster", "a kubelet, containerd, loop devices, mounts", runMain)
}

func runMain(m *testing.M) (code int) {
	root, err := harness.FindModuleRoot()
	if err != nil {
		fmt.Println("cluster:", err)
		return 1
	}
	c := &cluster{root: root, run: filepath.Join(root, "_output", "k8s", "run"),
		kubeconfig: filepath.Join(root, "_output", "k8s", "kubeconfig"), kubectl: filepath.Join(root, "_output", "k8s", "bin", "kubectl")}
	found := c.healthy()
	before := readHostState()
	t0 := time.Now()
	up := exec.Command("make", "--no-print-directory", "cluster-up")
	up.Dir, up.Stdout, up.Stderr = root, os.Stderr, os.Stderr
	if err := up.Run(); err != nil {
		fmt.Println("cluster: make cluster-up:", err)
		return 1
	}
	fmt.Printf("cluster: up in %s (images and binaries included)\n", time.Since(t0).Round(100*time.Millisecond))
	if !found && os.Getenv("CRUST_KEEP_CLUSTER") == "" {
		// The tier owns the cluster: it takes it down and checks that nothing of it is left.
		defer func() {
			t0 := time.Now()
			down := exec.Command("make", "--no-print-directory", "cluster-down")
			down.Dir, down.Stdout, down.Stderr = root, os.Stderr, os.Stderr
			if err := down.Run(); err != nil {
				fmt.Println("cluster: make cluster-down:", err)
				code = 1
			}
			fmt.Printf("cluster: down in %s\n", time.Since(t0).Round(100*time.Millisecond))
			if l := leftovers(root, c.run, before); len(l) > 0 {
				fmt.Printf("cluster: FAIL: make cluster-down left:\n  %s\n", strings.Join(l, "\n  "))
				code = 1
			}
		}()
	}
	if setupErr = c.connect(); setupErr == nil {
		cl = c
		watchCtx, endWatch := context.WithCancel(context.Background())
		defer endWatch()
		go c.watchVolumes(watchCtx)
	}
	dir, err := os.MkdirTemp("", "crust-cluster-bin")
	if err != nil {
		fmt.Println("cluster:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	build := exec.Command("go", "build", "-o", dir+"/", "crust.dev/crust/cmd/kubectl-crust")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Println("cluster: build:", err)
		return 1
	}
	c.binDir = dir
	return m.Run()
}

// healthy reports whether a cluster answers on the kubeconfig already.
func (c *cluster) healthy() bool {
	return exec.Command(c.kubectl, "--kubeconfig", c.kubeconfig, "get", "--raw", "/readyz").Run() == nil
}

func (c *cluster) connect() error {
	var err error
	if c.nsPID, err = c.recordedPID("ns"); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	nodes, err := c.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(nodes.Items) != 1 {
		return fmt.Errorf("%d nodes, want 1", len(nodes.Items))
	}
	c.node = nodes.Items[0].Name
	return nil
}

// recordedPID is the pid of the node's process recorded as name (hack/cluster/lib.sh: "PID START" in
// $RUN/pids/NAME.pid).
func (c *cluster) recordedPID(name string) (int, error) {
	f := filepath.Join(c.run, "pids", name+".pid")
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, fmt.Errorf("%s: %q is not \"PID START\"", f, b)
	}
	return strconv.Atoi(fields[0])
}

// get returns the cluster, or fails t when it could not be set up.
func get(t *testing.T) *cluster {
	t.Helper()
	if cl == nil {
		t.Fatalf("no cluster: %v", setupErr)
	}
	return cl
}
