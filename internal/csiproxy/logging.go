package csiproxy

import (
	"context"
	"log/slog"

	"crust.dev/crust/pkg/command"
)

// callLog is the proxy's call log (command.CallLog): kubelet's routine CSI calls at debug level, and the
// raw-forwarded calls (streams here, whose bodies are never logged) marked so.
func callLog(log *slog.Logger) command.CallLog {
	return command.CallLog{Log: log, Routine: command.RoutineCSI, Attrs: func(_ context.Context, _ string, req any) []any {
		if req == nil {
			return []any{"forwarded", "raw"}
		}
		return nil
	}}
}
