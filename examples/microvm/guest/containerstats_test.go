//go:build linux

package guest

import (
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses; utime 7, stime 3, cutime 20, cstime 10, rss 42 pages.
	line := "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 3 20 10 20 0 1 0 555 1000000 42 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
	u, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if u != (procUsage{user: 27, system: 13, rssPages: 42}) {
		t.Errorf("parseStat = %+v, want user 27, system 13, rss 42 pages", u)
	}
	for _, bad := range []string{"1234 no name", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 3 20 10 20 0 1 0 555 1 42"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestMeasureRoot(t *testing.T) {
	// Every process of this test's host has its root at or below "/": this one counts, with memory.
	all, err := measureRoot("/proc", "/")
	if err != nil {
		t.Fatal(err)
	}
	if all.Processes == 0 || all.MemoryRssBytes == 0 {
		t.Errorf("measureRoot(/) = %+v, want this process at least", all)
	}
	none, err := measureRoot("/proc", "/no/such/root")
	if err != nil || none.Processes != 0 {
		t.Errorf("measureRoot of a root no process has = %+v, %v; want nothing", none, err)
	}
	if !within("/run/c/root/sub", "/run/c/root") || within("/run/c/rootx", "/run/c/root") || !within("/a", "/") {
		t.Error("within is wrong about a path below, beside or under /")
	}
}
