//go:build linux

package guest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// userHZ is the unit of the times in /proc/<pid>/stat: USER_HZ, 100 on every architecture the guest
// runs on.
const userHZ = 100

// stats measures container id's processes: those whose root is its root or below it.
func (cs *containers) stats(id string) (*agentv1.ContainerStatsResponse, error) {
	if err := checkContainerID(id); err != nil {
		return nil, err
	}
	c, err := cs.get(id)
	if err != nil {
		return nil, err
	}
	return measureRoot("/proc", c.root)
}

// measureRoot sums the CPU times (with those of the children they waited for) and the resident memory
// of the processes in procDir, a proc filesystem, whose root directory is root or lies below it. A
// process that ends while it is read is left out.
func measureRoot(procDir, root string) (*agentv1.ContainerStatsResponse, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	page := uint64(os.Getpagesize())
	res := &agentv1.ContainerStatsResponse{}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		dir := filepath.Join(procDir, e.Name())
		if r, err := os.Readlink(filepath.Join(dir, "root")); err != nil || !within(r, root) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		u, err := parseStat(b)
		if err != nil {
			return nil, fmt.Errorf("%s/stat: %w", dir, err)
		}
		res.CpuUserNanos += u.user * (1e9 / userHZ)
		res.CpuSystemNanos += u.system * (1e9 / userHZ)
		res.MemoryRssBytes += u.rssPages * page
		res.Processes++
	}
	return res, nil
}

// within reports whether p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// procUsage is what one process used, as /proc/<pid>/stat says: times in clock ticks.
type procUsage struct {
	user, system uint64 // its own and its waited-for children's
	rssPages     uint64
}

// parseStat reads utime, stime, cutime, cstime and rss from a /proc/<pid>/stat line. The command name,
// in parentheses, may hold anything, spaces and parentheses too: the fields are counted after its last
// ')'.
func parseStat(b []byte) (procUsage, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procUsage{}, fmt.Errorf("no command name in %q", b)
	}
	// After the name: state (field 3) first; utime is field 14, rss field 24.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return procUsage{}, fmt.Errorf("%d fields after the command name, want at least 22", len(f))
	}
	var n [5]uint64
	for k, idx := range []int{11, 12, 13, 14, 21} {
		v, err := strconv.ParseUint(f[idx], 10, 64)
		if err != nil {
			return procUsage{}, fmt.Errorf("field %d: %w", idx+3, err)
		}
		n[k] = v
	}
	return procUsage{user: n[0] + n[2], system: n[1] + n[3], rssPages: n[4]}, nil
}
