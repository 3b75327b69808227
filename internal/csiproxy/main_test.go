package csiproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"crust.dev/crust/internal/recordfile"
)

// childEnv, when set, makes the test binary a crust-csi-proxy child for the crash tests; its value is a
// JSON childSpec.
const childEnv = "CSIPROXY_TEST_CHILD"

// childSpec is what a child proxy runs with.
type childSpec struct {
	Config Config
	// Crash is where the child kills itself.
	Crash crashPoint
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
	bootID, err := recordfile.ReadBootID()
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	j, err := OpenJournal(spec.Config.StateDir, bootID, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	deps := Deps{
		Journal:     crashingJournal{Journal: j, at: spec.Crash},
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(spec.Crash.interceptor)},
	}
	if spec.Pods != nil {
		deps.Pods = fakePods{pods: spec.Pods}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, spec.Config, log, deps); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// PhaseForgotten names, for a crash test, the instant right after a record was deleted; it is never
// stored.
const PhaseForgotten Phase = "forgotten"

// crashPoint is an instant at which a child proxy kills itself with SIGKILL: right after its journal
// durably records Phase in a record of Kind (PhaseForgotten: deletes such a record), or, with Method set,
// right after the call Method (to the driver or crustd) returns without error; with Before, right before
// the record is written or the call is made instead. The zero crashPoint is never.
type crashPoint struct {
	Kind   Kind
	Phase  Phase
	Method string
	Before bool
}

// String names the instant, as "after-published" or "before-NodeUnpublishVolume".
func (c crashPoint) String() string {
	when, what := "after-", string(c.Phase)
	if c.Before {
		when = "before-"
	}
	if c.Method != "" {
		what = path.Base(c.Method)
	}
	return when + what
}

// dieAt kills the process when (k, ph, before) is the crash point; it never returns then.
func (c crashPoint) dieAt(k Kind, ph Phase, before bool) {
	if c.Method == "" && c.Phase != "" && k == c.Kind && ph == c.Phase && before == c.Before {
		die()
	}
}

// interceptor kills the process before or after the chosen call, as the crash point says.
func (c crashPoint) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == c.Method && c.Before {
		die()
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && method == c.Method {
		die()
	}
	return err
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// crashingJournal is a Journal whose process dies by SIGKILL at a chosen change.
type crashingJournal struct {
	Journal
	at crashPoint
}

func (j crashingJournal) Put(r *Record) error {
	j.at.dieAt(r.Kind, r.Phase, true)
	err := j.Journal.Put(r)
	if err == nil {
		j.at.dieAt(r.Kind, r.Phase, false)
	}
	return err
}

func (j crashingJournal) Delete(k Kind, target string) error {
	j.at.dieAt(k, PhaseForgotten, true)
	err := j.Journal.Delete(k, target)
	if err == nil {
		j.at.dieAt(k, PhaseForgotten, false)
	}
	return err
}
