package csiproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"k8s.io/klog/v2"
)

// childEnv, when set, makes the test binary a crust-csi-proxy child for the crash tests; its value is a
// JSON childSpec.
const childEnv = "CSIPROXY_TEST_CHILD"

// childSpec is what a child proxy runs with.
type childSpec struct {
	Config Config
	// The child kills itself with SIGKILL right after reaching this phase of a record of this kind.
	CrashKind  Kind
	CrashPhase Phase
	// Pods, when set, is the pod cache (namespace/name to pod); RuntimeClass names are the handlers.
	Pods map[string]Pod
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	klog.LogToStderr(false) // mount-utils' klog lines; the tests' own logs say what matters
	klog.SetOutput(discard{})
	code := m.Run()
	if driverBuild.dir != "" {
		_ = os.RemoveAll(driverBuild.dir)
	}
	os.Exit(code)
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

func runChild(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 3
	}
	log := quietLog()
	var opts []option
	opts = append(opts, withHook(func(k Kind, ph Phase) {
		if k == spec.CrashKind && ph == spec.CrashPhase {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns
		}
	}))
	if spec.Pods != nil {
		opts = append(opts, withPods(fakePods{pods: spec.Pods}))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := run(ctx, spec.Config, log, opts...); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}
