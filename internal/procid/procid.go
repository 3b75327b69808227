// Package procid names a process so that the name survives pid reuse: its pid and its start time (clock
// ticks after boot, as /proc/PID/stat gives it). Two processes of one boot never share both.
package procid

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrGone is returned (wrapped) for a process that has exited: no such pid, a zombie, or a pid now used
// by a process that started at another time.
var ErrGone = errors.New("process is gone")

// StartTime returns the start time of process pid, in clock ticks after boot. A process that has exited
// (a zombie included) is ErrGone; any other failure to read /proc is returned as it is.
func StartTime(pid int32) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold anything: the fields that follow are counted after its
	// last ')'. They start with field 3 (state); the start time is field 22.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: unreadable /proc stat %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("pid %d: /proc stat has %d fields after the name", pid, len(f))
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("pid %d has exited (state %s): %w", pid, f[0], ErrGone)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether the process that had pid and start time start still runs. It is false when the
// pid is gone, a zombie, or reused by a later process; it is true when /proc cannot be read for another
// reason (what cannot be checked is not declared dead).
func Alive(pid int32, start uint64) bool {
	got, err := StartTime(pid)
	if errors.Is(err, ErrGone) {
		return false
	}
	return err != nil || got == start
}
