package manager

import (
	"context"
	"errors"
	"strings"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
)

// Staging a target again with other I/O limits is ALREADY_EXISTS naming io_limits (limits of a volume in
// use are not changed); limits of zeros are the same as none.
func TestStageIOLimitsAreParameters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.spec(0, 0)
	s.IoLimits = &crustv1.IOLimits{WriteBytesPerSecond: 1 << 20}
	e.stage(s)
	s.IoLimits.WriteBytesPerSecond = 2 << 20
	if _, err := e.m.Stage(ctx, s); !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "io_limits") {
		t.Fatalf("stage with other limits: %v, want ALREADY_EXISTS naming io_limits", err)
	}
	none := e.spec(1, 1)
	e.stage(none)
	none.IoLimits = &crustv1.IOLimits{}
	if _, err := e.m.Stage(ctx, none); err != nil {
		t.Fatalf("stage again with zero limits: %v, want the same volume", err)
	}
}
