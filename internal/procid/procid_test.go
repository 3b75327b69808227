package procid

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"crust.dev/crust/internal/testutil/harness"
)

// TestStartTime tells a running process from one that exited, a zombie, and a pid with another start
// time (pid reuse).
func TestStartTime(t *testing.T) {
	self := int32(os.Getpid())
	start, err := StartTime(self)
	if err != nil || start == 0 {
		t.Fatalf("StartTime(self) = %d, %v", start, err)
	}
	if !Alive(self, start) {
		t.Error("Alive(self) = false")
	}
	if Alive(self, start+1) {
		t.Error("a pid with another start time (reused) counts as alive")
	}

	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := int32(cmd.Process.Pid)
	cstart, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Kill()
	// Not yet waited for: a zombie, which has exited.
	harness.Eventually(t, 10*time.Second, "the killed child to exit", func() bool { return !Alive(pid, cstart) })
	if _, err := StartTime(pid); !errors.Is(err, ErrGone) {
		t.Errorf("StartTime(zombie) error %v, want ErrGone", err)
	}
	_ = cmd.Wait()
	if _, err := StartTime(pid); !errors.Is(err, ErrGone) {
		t.Errorf("StartTime(reaped) error %v, want ErrGone", err)
	}
	if _, err := StartTime(0); !errors.Is(err, ErrGone) {
		t.Errorf("StartTime(0) error %v, want ErrGone", err)
	}
}
