package csiproxy

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	"crust.dev/crust/api/errdefs"
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

// toGRPC is where the typed calls' errors become gRPC statuses (errdefs.ToGRPC), once, inside the call
// log, so that the log and the metrics see the code the caller is sent.
func toGRPC(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, errdefs.ToGRPC(err)
}

// toGRPCStream is toGRPC for the raw-forwarded calls.
func toGRPCStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return errdefs.ToGRPC(h(srv, ss))
}
