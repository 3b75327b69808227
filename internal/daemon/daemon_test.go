package daemon_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/recordfile/recordfiletest"
	"crust.dev/crust/internal/testutil/crustdtest"
	"crust.dev/crust/internal/testutil/harness"
)

// A second crustd on a state directory in use fails at once, naming the flag, the directory and the
// first, with the refusal every user of the record engine gives (the proxy's: internal/csiproxy); the
// first serves on.
func TestSecondDaemonOnOneStateDir(t *testing.T) {
	first, err := crustdtest.FileConfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	crustdtest.StartT(t, first, nil)
	second, err := crustdtest.FileConfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	second.StateDir = first.StateDir
	ctx, cancel := harness.Context(t, 10*time.Second) // were it not refused, it would serve until then
	defer cancel()
	err = daemon.Run(ctx, second, slog.New(slog.DiscardHandler))
	recordfiletest.WantHeld(t, err, first.StateDir, "crustd")
	if !strings.HasPrefix(err.Error(), "--state-dir: ") {
		t.Errorf("the refusal does not name the flag: %v", err)
	}
	if err := harness.WaitServing(ctx, first.Socket, nil); err != nil {
		t.Fatalf("the first crustd stopped serving: %v", err)
	}
}
