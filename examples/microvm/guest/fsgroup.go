//go:build linux

package guest

import (
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/pkg/fsgroup"
)

// applyFSGroup gives the tree under root the group gid as kubelet does for a pod's fsGroup (see
// pkg/fsgroup), under the mount request's policy.
func applyFSGroup(root string, gid int, policy agentv1.FsGroupPolicy) error {
	p := fsgroup.Always
	if policy == agentv1.FsGroupPolicy_FS_GROUP_POLICY_ON_ROOT_MISMATCH {
		p = fsgroup.OnRootMismatch
	}
	return fsgroup.Apply(root, gid, p)
}
