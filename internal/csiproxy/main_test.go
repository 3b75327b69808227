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

	"crust.dev/crust/internal/recordfile"
)

// childEnv, when set, makes the test binary a crust-csi-proxy child for the crash tests; its value is a
// JSON childSpec.
const childEnv = "CSIPROXY_TEST_CHILD"

// childSpec is what a child proxy runs with.
type childSpec struct {
	Config Config
	// The child kills itself with SIGKILL right after its journal durably records this phase of a
	// record of this kind (PhaseForgotten: right after it deletes such a record).
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
	deps := Deps{Journal: crashingJournal{Journal: j, kind: spec.CrashKind, phase: spec.CrashPhase}}
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

// crashingJournal is a Journal whose process dies by SIGKILL right after a chosen durable change.
type crashingJournal struct {
	Journal
	kind  Kind
	phase Phase
}

func (j crashingJournal) Put(r *Record) error {
	err := j.Journal.Put(r)
	j.dieAt(err, r.Kind, r.Phase)
	return err
}

func (j crashingJournal) Delete(k Kind, path string) error {
	err := j.Journal.Delete(k, path)
	j.dieAt(err, k, PhaseForgotten)
	return err
}

// dieAt kills the process when the change that just succeeded is the chosen one; it never returns then.
func (j crashingJournal) dieAt(err error, k Kind, ph Phase) {
	if err == nil && k == j.kind && ph == j.phase {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
