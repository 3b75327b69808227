//go:build linux

package guest

import (
	"context"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

const (
	defaultExecTimeout = 30 * time.Second
	maxExecTimeout     = 10 * time.Minute
)

// agent serves AgentService.
type agent struct {
	start time.Time
	mods  *moduleLoader
	procs *procTable
	vols  *volumes
	ctrs  *containers
}

var _ agentv1.AgentServiceService = (*agent)(nil)

func newAgent(start time.Time, procs *procTable, mods *moduleLoader) *agent {
	return &agent{start: start, mods: mods, procs: procs, vols: newVolumes(procs, mods.wait),
		ctrs: newContainers(procs)}
}

// version is the agent's build's module version, or "devel".
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// Health answers how the agent is; with WaitStarted, once its start is over (a failed module load is
// over too: the answer says started, and a mount answers the failure).
func (a *agent) Health(ctx context.Context, r *agentv1.HealthRequest) (*agentv1.HealthResponse, error) {
	if r.GetWaitStarted() {
		select {
		case <-a.mods.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var u unix.Utsname
	_ = unix.Uname(&u)
	return &agentv1.HealthResponse{
		Version:      version(),
		Kernel:       unix.ByteSliceToString(u.Release[:]),
		UptimeMillis: time.Since(a.start).Milliseconds(),
		Started:      a.mods.over(),
	}, nil
}

func (a *agent) Mount(ctx context.Context, r *agentv1.MountRequest) (*agentv1.MountResponse, error) {
	return a.vols.mount(ctx, r)
}

func (a *agent) Unmount(_ context.Context, r *agentv1.UnmountRequest) (*agentv1.UnmountResponse, error) {
	return &agentv1.UnmountResponse{}, a.vols.unmount(r.GetTarget())
}

func (a *agent) Statfs(_ context.Context, r *agentv1.StatfsRequest) (*agentv1.StatfsResponse, error) {
	return a.vols.statfs(r.GetTarget())
}

func (a *agent) Grow(ctx context.Context, r *agentv1.GrowRequest) (*agentv1.GrowResponse, error) {
	return a.vols.grow(ctx, r)
}

// Shutdown unmounts every volume and syncs, then answers; the host stops the VM.
func (a *agent) Shutdown(context.Context, *agentv1.ShutdownRequest) (*agentv1.ShutdownResponse, error) {
	a.vols.unmountAll()
	unix.Sync()
	logger.Printf("volumes unmounted and synced; the host stops the VM")
	return &agentv1.ShutdownResponse{}, nil
}

func (a *agent) Exec(ctx context.Context, args *agentv1.ExecRequest) (*agentv1.ExecResponse, error) {
	timeout := time.Duration(args.GetTimeoutMillis()) * time.Millisecond
	switch {
	case timeout < 0:
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "timeout_millis: negative")
	case timeout == 0:
		timeout = defaultExecTimeout
	case timeout > maxExecTimeout:
		timeout = maxExecTimeout
	}
	res, err := a.procs.run(ctx, args.GetArgv(), timeout)
	if err != nil {
		return nil, err
	}
	return &agentv1.ExecResponse{
		Stdout:     res.stdout,
		Stderr:     res.stderr,
		ExitStatus: int32(res.status),
		TimedOut:   res.timedOut,
		Truncated:  res.truncated,
	}, nil
}
