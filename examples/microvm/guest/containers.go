//go:build linux

package guest

import (
	"context"

	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/pkg/errdefs"
)

// The container API: not served yet; every call answers UNIMPLEMENTED.

func notYet(call string) error {
	return agentproto.Errorf(errdefs.ErrUnimplemented, "%s: not implemented by this agent yet", call)
}

func (a *agent) MountShare(context.Context, *agentv1.MountShareRequest) (*agentv1.MountShareResponse, error) {
	return nil, notYet("MountShare")
}

func (a *agent) CreateContainer(context.Context, *agentv1.CreateContainerRequest) (*agentv1.CreateContainerResponse, error) {
	return nil, notYet("CreateContainer")
}

func (a *agent) StartProcess(context.Context, *agentv1.StartProcessRequest) (*agentv1.StartProcessResponse, error) {
	return nil, notYet("StartProcess")
}

func (a *agent) WaitProcess(context.Context, *agentv1.WaitProcessRequest) (*agentv1.WaitProcessResponse, error) {
	return nil, notYet("WaitProcess")
}

func (a *agent) SignalProcess(context.Context, *agentv1.SignalProcessRequest) (*agentv1.SignalProcessResponse, error) {
	return nil, notYet("SignalProcess")
}

func (a *agent) ReadStream(context.Context, *agentv1.ReadStreamRequest) (*agentv1.ReadStreamResponse, error) {
	return nil, notYet("ReadStream")
}

func (a *agent) WriteStdin(context.Context, *agentv1.WriteStdinRequest) (*agentv1.WriteStdinResponse, error) {
	return nil, notYet("WriteStdin")
}

func (a *agent) CloseStdin(context.Context, *agentv1.CloseStdinRequest) (*agentv1.CloseStdinResponse, error) {
	return nil, notYet("CloseStdin")
}

func (a *agent) ResizeTerminal(context.Context, *agentv1.ResizeTerminalRequest) (*agentv1.ResizeTerminalResponse, error) {
	return nil, notYet("ResizeTerminal")
}

func (a *agent) RemoveContainer(context.Context, *agentv1.RemoveContainerRequest) (*agentv1.RemoveContainerResponse, error) {
	return nil, notYet("RemoveContainer")
}
