//go:build linux

package guest

import (
	"context"
	"encoding/json"
	"time"

	"golang.org/x/sys/unix"

	"crust.dev/crust/examples/microvm/agentproto"
)

const (
	defaultExecTimeout = 30 * time.Second
	maxExecTimeout     = 10 * time.Minute
)

// agent serves the protocol's operations.
type agent struct {
	start time.Time
	procs *procTable
	vols  *volumes
}

func newAgent(start time.Time, procs *procTable, mods *moduleLoader) *agent {
	return &agent{start: start, procs: procs, vols: newVolumes(procs, mods.wait)}
}

func decode(req agentproto.Request, v any) error {
	if len(req.Args) == 0 {
		return agentproto.Errorf(agentproto.CodeInvalidArgument, "%s needs arguments", req.Op)
	}
	if err := json.Unmarshal(req.Args, v); err != nil {
		return agentproto.Errorf(agentproto.CodeInvalidArgument, "%s arguments: %v", req.Op, err)
	}
	return nil
}

func (a *agent) handle(ctx context.Context, req agentproto.Request) (any, error) {
	switch req.Op {
	case agentproto.OpPing:
		var u unix.Utsname
		_ = unix.Uname(&u)
		return agentproto.PingResult{Kernel: unix.ByteSliceToString(u.Release[:]), UptimeMillis: time.Since(a.start).Milliseconds()}, nil
	case agentproto.OpMount:
		var args agentproto.MountArgs
		if err := decode(req, &args); err != nil {
			return nil, err
		}
		return a.vols.mount(ctx, args)
	case agentproto.OpUnmount:
		var args agentproto.UnmountArgs
		if err := decode(req, &args); err != nil {
			return nil, err
		}
		return nil, a.vols.unmount(args.Target)
	case agentproto.OpStatfs:
		var args agentproto.StatfsArgs
		if err := decode(req, &args); err != nil {
			return nil, err
		}
		return a.vols.statfs(args.Target)
	case agentproto.OpGrow:
		var args agentproto.GrowArgs
		if err := decode(req, &args); err != nil {
			return nil, err
		}
		return a.vols.grow(ctx, args)
	case agentproto.OpExec:
		var args agentproto.ExecArgs
		if err := decode(req, &args); err != nil {
			return nil, err
		}
		return a.exec(ctx, args)
	case agentproto.OpShutdown:
		go func() {
			// Let the answer reach the host first.
			time.Sleep(100 * time.Millisecond)
			a.vols.unmountAll()
			logger.Printf("powering off")
			PowerOff()
		}()
		return nil, nil
	}
	return nil, agentproto.Errorf(agentproto.CodeUnimplemented, "unknown op %q", req.Op)
}

func (a *agent) exec(ctx context.Context, args agentproto.ExecArgs) (agentproto.ExecResult, error) {
	timeout := time.Duration(args.TimeoutMillis) * time.Millisecond
	switch {
	case timeout < 0:
		return agentproto.ExecResult{}, agentproto.Errorf(agentproto.CodeInvalidArgument, "negative timeout")
	case timeout == 0:
		timeout = defaultExecTimeout
	case timeout > maxExecTimeout:
		timeout = maxExecTimeout
	}
	res, err := a.procs.run(ctx, args.Argv, timeout)
	if err != nil {
		return agentproto.ExecResult{}, err
	}
	return agentproto.ExecResult{
		Stdout:     res.stdout,
		Stderr:     res.stderr,
		ExitStatus: res.status,
		TimedOut:   res.timedOut,
		Truncated:  res.truncated,
	}, nil
}
