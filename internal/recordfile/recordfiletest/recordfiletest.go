// Package recordfiletest checks, for the tests of every user of the record engine (internal/recordfile),
// what the engine promises them all alike.
package recordfiletest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/recordfile"
)

// WantHeld fails t unless err is the engine's refusal of a second opener of dir while this process holds
// it as holder: an error wrapping recordfile.ErrHeld and errdefs.ErrFailedPrecondition whose text names
// dir and the holder.
func WantHeld(t testing.TB, err error, dir, holder string) {
	t.Helper()
	want := fmt.Sprintf("%s is held by pid %d (%s)", dir, os.Getpid(), holder)
	if !errors.Is(err, recordfile.ErrHeld) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(fmt.Sprint(err), want) {
		t.Fatalf("a second opener of %s: %v; want the record engine's refusal, FAILED_PRECONDITION naming %q", dir, err, want)
	}
}
