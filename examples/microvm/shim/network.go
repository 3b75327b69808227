package shim

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/podnet"
	"crust.dev/crust/examples/microvm/vm"
)

// guestNIC is the name of the guest's one network card.
const guestNIC = "eth0"

// podNetwork connects the pod's network namespace, which the sandbox container's spec names, to a tap
// for the VM (package podnet). A spec with no network namespace of its own (a host-network pod, or a
// container run without CRI) gives nil: the VM has no NIC. A namespace the CNI plugin gave no address is
// nil too, said in the log.
func podNetwork(spec *specs.Spec) (*podnet.Link, error) {
	if spec.Linux == nil {
		return nil, nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type != specs.NetworkNamespace || ns.Path == "" {
			continue
		}
		l, err := podnet.Connect(ns.Path)
		if errors.Is(err, podnet.ErrNoInterface) {
			return nil, nil
		}
		return l, err
	}
	return nil, nil
}

// nics are the VM's NICs for link (none for nil).
func nics(link *podnet.Link) []vm.NIC {
	if link == nil {
		return nil
	}
	return []vm.NIC{{Tap: link.Tap, MAC: link.Interface.MAC}}
}

// configureNetwork gives the guest's NIC the pod interface's addresses and routes, once the guest's start
// is over (its NIC's driver is one of the modules it loads).
func configureNetwork(ctx context.Context, agent agentv1.AgentServiceService, link *podnet.Link) error {
	if _, err := agent.Health(ctx, &agentv1.HealthRequest{WaitStarted: true}); err != nil {
		return fmt.Errorf("waiting for the guest's start: %w", err)
	}
	for _, argv := range link.Interface.GuestCommands(guestNIC) {
		if err := guestExec(ctx, agent, "configuring the guest's network ("+strings.Join(argv, " ")+")", argv...); err != nil {
			return err
		}
	}
	return nil
}
