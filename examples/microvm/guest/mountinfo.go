//go:build linux

package guest

import (
	"io"
	"os"

	"github.com/moby/sys/mountinfo"
)

// mountEntry is what the agent needs of a mount.
type mountEntry struct {
	target string
	fsType string
	source string // as mounted, e.g. /dev/vda
}

// findMount returns the topmost mount on target, if any.
func findMount(target string) (mountEntry, bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, false
	}
	defer func() { _ = f.Close() }()
	return findMountIn(f, target)
}

// findMountIn returns the topmost mount on target in r, a mountinfo table. A table that does not parse
// finds nothing.
func findMountIn(r io.Reader, target string) (mountEntry, bool) {
	infos, err := mountinfo.GetMountsFromReader(r, func(i *mountinfo.Info) (skip, stop bool) {
		return i.Mountpoint != target, false
	})
	if err != nil || len(infos) == 0 {
		return mountEntry{}, false
	}
	i := infos[len(infos)-1] // later lines are mounted on top of earlier ones
	return mountEntry{target: i.Mountpoint, fsType: i.FSType, source: i.Source}, true
}
