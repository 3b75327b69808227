//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// The container API: AgentService's calls that run a pod's containers in the guest.

// MountShare mounts the virtio-fs share tag on target; the same share there again does nothing.
func (a *agent) MountShare(ctx context.Context, r *agentv1.MountShareRequest) (*agentv1.MountShareResponse, error) {
	tag, target := r.GetTag(), r.GetTarget()
	if tag == "" {
		return nil, agentproto.Errorf(errdefs.ErrInvalidArgument, "tag: empty")
	}
	if err := checkTarget(target); err != nil {
		return nil, err
	}
	if err := a.mods.wait(ctx); err != nil { // virtiofs is a module
		return nil, err
	}
	if m, ok := findMount(target); ok {
		if m.fsType == "virtiofs" && m.source == tag {
			return &agentv1.MountShareResponse{}, nil
		}
		return nil, agentproto.Errorf(errdefs.ErrFailedPrecondition, "target %s: %s of %s is mounted there", target, m.fsType, m.source)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return nil, err
	}
	if err := unix.Mount(tag, target, "virtiofs", 0, ""); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
			return nil, agentproto.Errorf(errdefs.ErrNotFound, "tag %q: mounting the virtio-fs share on %s: %v (no such share?)", tag, target, err)
		}
		return nil, fmt.Errorf("mounting the virtio-fs share %q on %s: %w", tag, target, err)
	}
	logger.Printf("virtio-fs share %s mounted on %s", tag, target)
	return &agentv1.MountShareResponse{}, nil
}

func (a *agent) CreateContainer(_ context.Context, r *agentv1.CreateContainerRequest) (*agentv1.CreateContainerResponse, error) {
	return &agentv1.CreateContainerResponse{}, a.ctrs.create(r)
}

func (a *agent) StartProcess(_ context.Context, r *agentv1.StartProcessRequest) (*agentv1.StartProcessResponse, error) {
	pid, err := a.ctrs.start(r)
	if err != nil {
		return nil, err
	}
	return &agentv1.StartProcessResponse{Pid: int32(pid)}, nil
}

func (a *agent) WaitProcess(ctx context.Context, r *agentv1.WaitProcessRequest) (*agentv1.WaitProcessResponse, error) {
	return a.ctrs.wait(ctx, r)
}

func (a *agent) SignalProcess(_ context.Context, r *agentv1.SignalProcessRequest) (*agentv1.SignalProcessResponse, error) {
	return &agentv1.SignalProcessResponse{}, a.ctrs.signal(r)
}

func (a *agent) ReadStream(ctx context.Context, r *agentv1.ReadStreamRequest) (*agentv1.ReadStreamResponse, error) {
	return a.ctrs.read(ctx, r)
}

func (a *agent) WriteStdin(ctx context.Context, r *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
	return &agentv1.WriteStdinResponse{}, a.ctrs.writeStdin(ctx, r)
}

func (a *agent) CloseStdin(_ context.Context, r *agentv1.CloseStdinRequest) (*agentv1.CloseStdinResponse, error) {
	return &agentv1.CloseStdinResponse{}, a.ctrs.closeStdin(r)
}

func (a *agent) ResizeTerminal(_ context.Context, r *agentv1.ResizeTerminalRequest) (*agentv1.ResizeTerminalResponse, error) {
	return &agentv1.ResizeTerminalResponse{}, a.ctrs.resize(r)
}

func (a *agent) RemoveContainer(ctx context.Context, r *agentv1.RemoveContainerRequest) (*agentv1.RemoveContainerResponse, error) {
	return &agentv1.RemoveContainerResponse{}, a.ctrs.remove(ctx, r.GetContainerId())
}

func (a *agent) ContainerStats(_ context.Context, r *agentv1.ContainerStatsRequest) (*agentv1.ContainerStatsResponse, error) {
	return a.ctrs.stats(r.GetContainerId())
}
