package store

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// crashChildEnv, when set, makes TestCrash the child: it writes into the store directory it names until it
// is killed.
const crashChildEnv = "CRUST_STORE_CRASH_CHILD_DIR"

const (
	crashTargets = 16
	crashBoot    = "c0ffee00-0000-4000-8000-000000000001"
)

func crashTarget(i int) string { return fmt.Sprintf("/var/lib/kubelet/pods/crash/%02d/mount", i) }

// crashVolume is generation gen of target i. Its size varies with gen, so a torn or mixed record would
// not pass for a whole one.
func crashVolume(i, gen int) *crustv1.Volume {
	v := vol(crashTarget(i))
	v.Spec.VolumeId = "gen-" + strconv.Itoa(gen)
	v.Spec.Metadata = map[string]string{
		"gen": strconv.Itoa(gen),
		"pad": strings.Repeat(string(rune('a'+gen%26)), gen*131%6000),
	}
	return v
}

// parseCrashVolume returns the target index and generation of a volume written by crashVolume, and fails
// unless the record is exactly what crashVolume wrote for them.
func parseCrashVolume(v *crustv1.Volume) (i, gen int, err error) {
	target := v.GetSpec().GetVolumeTargetPath()
	if _, err := fmt.Sscanf(target, "/var/lib/kubelet/pods/crash/%02d/mount", &i); err != nil || i < 0 || i >= crashTargets {
		return 0, 0, fmt.Errorf("unexpected target %q", target)
	}
	if gen, err = strconv.Atoi(strings.TrimPrefix(v.GetSpec().GetVolumeId(), "gen-")); err != nil {
		return 0, 0, fmt.Errorf("target %d: volume id %q", i, v.GetSpec().GetVolumeId())
	}
	if !proto.Equal(v, crashVolume(i, gen)) {
		return 0, 0, fmt.Errorf("target %d: record of generation %d differs from what was written", i, gen)
	}
	return i, gen, nil
}

// TestCrash kills a writer with SIGKILL at random instants and checks after each kill that every record
// is whole, verifies, and holds the last acknowledged generation or the one that was being written; never
// an older one. A kill leaves the page cache intact, so this tests atomicity and ordering, not what a power
// failure does to unsynced data.
func TestCrash(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	budget, maxRuns := 8*time.Second, 400
	if testing.Short() {
		budget, maxRuns = 2*time.Second, 100
	}
	dir := t.TempDir()
	known := make([]int, crashTargets) // per target, the generation it must at least hold (0: none yet)
	var runs, acks, inFlightLanded, tmpLeftovers int
	// The budget is what a quiet machine spends; a busy one goes on until the test has proved enough (10
	// kills and an acknowledged write), for at most ten budgets: progress, not a rate, ends the loop.
	start := time.Now()
	enough := func() bool { return runs >= 10 && acks > 0 }
	for ; runs < maxRuns && (time.Since(start) < budget || !enough() && time.Since(start) < 10*budget); runs++ {
		lines := runCrashChild(t, dir)
		for _, l := range lines {
			var i, gen int
			if _, err := fmt.Sscanf(l, "ack %d %d", &i, &gen); err != nil {
				continue // the testing package's own output
			}
			if i < 0 || i >= crashTargets || gen != known[i]+1 {
				t.Fatalf("run %d: child acknowledged %q out of sequence", runs, l)
			}
			known[i] = gen
			acks++
		}

		if names, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(names) > 0 { // absent if killed early
			tmpLeftovers++
		}
		var logs bytes.Buffer
		s, r, err := Open(dir, crashBoot, testLogger(&logs))
		if err != nil {
			t.Fatalf("run %d: Open after a kill: %v", runs, err)
		}
		s.Close() // for the next child
		if len(r.Corrupt) > 0 || len(r.Dropped) > 0 {
			t.Fatalf("run %d: Corrupt %v, Dropped %v after a kill\n%s", runs, r.Corrupt, r.Dropped, logs.String())
		}
		stored := make([]int, crashTargets)
		for _, v := range r.Volumes {
			i, gen, err := parseCrashVolume(v)
			if err != nil {
				t.Fatalf("run %d: %v", runs, err)
			}
			stored[i] = gen
		}
		for i := range crashTargets {
			switch stored[i] {
			case known[i]:
			case known[i] + 1:
				inFlightLanded++
			default:
				t.Fatalf("run %d: target %d holds generation %d; acknowledged %d", runs, i, stored[i], known[i])
			}
			known[i] = stored[i]
		}
	}
	t.Logf("%d kills, %d acknowledged writes, %d in-flight writes found whole, %d kills left a temporary file",
		runs, acks, inFlightLanded, tmpLeftovers)
	if !enough() {
		t.Fatalf("only %d runs and %d acknowledged writes in %s: the test proved little", runs, acks, time.Since(start).Round(time.Second))
	}
}

// runCrashChild starts the child, lets it write for a random while and kills it with SIGKILL. It returns
// the lines the child printed.
func runCrashChild(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	firstLine := make(chan struct{})
	done := make(chan []string)
	go func() {
		var lines []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if len(lines) == 0 {
				close(firstLine)
			}
			lines = append(lines, sc.Text())
		}
		if len(lines) == 0 {
			close(firstLine)
		}
		done <- lines
	}()

	// Mostly kill while the child is writing; sometimes while it is still starting or opening the store.
	if rand.IntN(8) != 0 {
		select {
		case <-firstLine:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("the child wrote nothing in 10s; stderr:\n%s", stderr.String())
		}
	}
	time.Sleep(rand.N(5 * time.Millisecond))
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	lines := <-done
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
		t.Fatalf("the child ended on its own (%v) instead of being killed; stderr:\n%s", err, stderr.String())
	}
	return lines
}

// crashChild puts generation after generation of the crash volumes, printing each acknowledged one, until
// it is killed.
func crashChild(dir string) {
	s, r, err := Open(dir, crashBoot, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: Open:", err)
		os.Exit(3)
	}
	gen := make([]int, crashTargets)
	for _, v := range r.Volumes {
		i, g, err := parseCrashVolume(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(3)
		}
		gen[i] = g
	}
	for {
		i := rand.IntN(crashTargets)
		gen[i]++
		if err := s.Put(crashVolume(i, gen[i])); err != nil {
			fmt.Fprintln(os.Stderr, "child: Put:", err)
			os.Exit(3)
		}
		// One write(2) per line on an unbuffered pipe: a line is either read whole or not at all.
		if _, err := fmt.Fprintf(os.Stdout, "ack %d %d\n", i, gen[i]); err != nil {
			os.Exit(3)
		}
	}
}
