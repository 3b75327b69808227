//go:build linux

package guest

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
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
	var found mountEntry
	ok := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if e, good := parseMountinfo(sc.Text()); good && e.target == target {
			found, ok = e, true // later lines are mounted on top of earlier ones
		}
	}
	return found, ok
}

// parseMountinfo parses "ID PARENT MAJ:MIN ROOT TARGET OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS".
func parseMountinfo(line string) (mountEntry, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
		return mountEntry{}, false
	}
	return mountEntry{
		target: unescapeMountinfo(fields[4]),
		fsType: fields[sep+1],
		source: unescapeMountinfo(fields[sep+2]),
	}, true
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space, ...).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
