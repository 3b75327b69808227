package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// RootMain is the TestMain of a tier that needs root. Run by any other user it prints
// "TIER: skipped, needs root (WHY)" and exits 0 without running a test; run by root it exits with the
// status run(m) returns, after run's deferred clean-ups have run.
func RootMain(m *testing.M, tier, why string, run func(*testing.M) int) {
	if os.Geteuid() != 0 {
		fmt.Printf("%s: skipped, needs root (%s)\n", tier, why)
		os.Exit(0)
	}
	os.Exit(run(m))
}

// Run runs the command name args and returns its output (stdout and stderr together) with surrounding
// white space trimmed. A command that cannot start or exits non-zero fails the test, with its output.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// SyncBuffer is a bytes.Buffer that one goroutine (a child process's output copier, a log handler)
// may write while another reads it. Its zero value is empty and ready.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer; it never fails.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StatxAttributes returns stat.attributes from the output of xfs_io's `statx -r` (as a guest prints it
// for a file, for instance to see STATX_ATTR_DAX). Output without that line, or with a value that is
// not a number, fails the test.
func StatxAttributes(t testing.TB, out string) uint64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "stat.attributes = "); ok {
			n, err := strconv.ParseUint(v, 0, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no stat.attributes in xfs_io's statx output:\n%s", out)
	return 0
}
