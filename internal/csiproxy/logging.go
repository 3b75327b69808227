package csiproxy

import (
	"context"
	"log/slog"
	"time"

	"crust.dev/crust/pkg/errdefs"
	"crust.dev/crust/pkg/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// logMessage renders a message for the log with its secrets stripped.
func logMessage(m any) string {
	pm, ok := m.(proto.Message)
	if !ok || pm == nil {
		return ""
	}
	b, err := protojson.MarshalOptions{}.Marshal(volume.StripSecrets(pm))
	if err != nil {
		return "<unprintable>"
	}
	return string(b)
}

// quietMethods are the read-only calls kubelet and probes make all the time; their successes are logged
// at Debug.
var quietMethods = map[string]bool{
	csi.Identity_GetPluginInfo_FullMethodName:         true,
	csi.Identity_GetPluginCapabilities_FullMethodName: true,
	csi.Identity_Probe_FullMethodName:                 true,
	csi.Node_NodeGetCapabilities_FullMethodName:       true,
	csi.Node_NodeGetInfo_FullMethodName:               true,
	csi.Node_NodeGetVolumeStats_FullMethodName:        true,
}

// unaryLog is the one place typed calls are logged, and where their errors become gRPC
// statuses (errdefs.ToGRPC): method, code and duration at Info (failures at Warn), and the request and
// response, secrets stripped, at Debug.
func unaryLog(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		if log.Enabled(ctx, slog.LevelDebug) {
			log.DebugContext(ctx, "call", "method", info.FullMethod, "request", logMessage(req))
		}
		resp, err := h(ctx, req)
		err = errdefs.ToGRPC(err)
		st := status.Convert(err)
		elapsed := time.Since(start)
		attrs := []any{"method", info.FullMethod, "code", st.Code().String(), "duration", elapsed}
		switch {
		case err != nil:
			log.WarnContext(ctx, "call failed", append(attrs, "message", st.Message())...)
		case quietMethods[info.FullMethod]:
			log.DebugContext(ctx, "call", attrs...)
		default:
			log.InfoContext(ctx, "call", attrs...)
		}
		if err == nil {
			if log.Enabled(ctx, slog.LevelDebug) {
				log.DebugContext(ctx, "response", "method", info.FullMethod, "response", logMessage(resp))
			}
		}
		return resp, err
	}
}

// streamLog logs raw-forwarded calls, and makes their errors gRPC statuses: method, code and
// duration only, never their bodies.
func streamLog(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		start := time.Now()
		err := errdefs.ToGRPC(h(srv, ss))
		st := status.Convert(err)
		elapsed := time.Since(start)
		attrs := []any{"method", info.FullMethod, "code", st.Code().String(), "duration", elapsed, "forwarded", "raw"}
		if err != nil {
			log.Warn("call failed", append(attrs, "message", st.Message())...)
		} else {
			log.Info("call", attrs...)
		}
		return err
	}
}
