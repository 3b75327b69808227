//go:build linux

package guest

import (
	"crust.dev/crust/examples/microvm/agentproto"
	"crust.dev/crust/pkg/fsgroup"
)

// applyFSGroup gives the tree under root the group gid as kubelet does for a pod's fsGroup (see
// pkg/fsgroup), under the mount request's policy.
func applyFSGroup(root string, gid int, policy agentproto.FSGroupPolicy) error {
	p := fsgroup.Always
	if policy == agentproto.FSGroupOnRootMismatch {
		p = fsgroup.OnRootMismatch
	}
	return fsgroup.Apply(root, gid, p)
}
