package command

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/volume"
)

// CallLog is how every crust server logs its gRPC calls, so that crustd, the CSI proxy and the reference
// driver write one shape of line: message "call", with method, code and duration, then the server's own
// attributes (Attrs). The level says how the call went:
//
//	debug  a success of a Routine method (a probe, a read made all the time)
//	info   any other success
//	warn   a failure the caller can act on; "err" holds the status message
//	error  a failure of the server's own (INTERNAL, UNKNOWN, DATA_LOSS), "err" likewise
//
// At debug level the line also carries the request and the response in text form, their secret metadata
// redacted (volume.StripSecrets). A panic in a handler is logged at error level with its stack and
// answered INTERNAL; the process goes on.
//
// go-grpc-middleware's logging interceptor sets levels by code only and logs payloads with no hook to
// redact them; this is the part of it crust needs.
type CallLog struct {
	// Log receives the lines; nil is slog.Default().
	Log *slog.Logger
	// Routine names the methods (full names) whose successes are logged at debug level.
	Routine map[string]bool
	// Attrs returns key-value pairs for a call's line, taken from its context and request (nil for a
	// stream); nil adds none.
	Attrs func(ctx context.Context, method string, req any) []any
}

// StreamWorkers is the option every crust gRPC server is made with: calls run on a worker goroutine per
// CPU whose stack has grown already, instead of on a new goroutine each (docs/performance.md measures
// it). A long call or stream holds a worker, and calls beyond the workers get goroutines of their own,
// as without the option, so no call waits for another.
func StreamWorkers() grpc.ServerOption {
	return grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))) //nolint:gosec // GOMAXPROCS is positive
}

// RoutineCSI are the CSI calls kubelet and probes make all the time: the identity calls, the node's
// capabilities and info, and a volume's stats (every volume, every minute).
var RoutineCSI = map[string]bool{
	csi.Identity_GetPluginInfo_FullMethodName:         true,
	csi.Identity_GetPluginCapabilities_FullMethodName: true,
	csi.Identity_Probe_FullMethodName:                 true,
	csi.Node_NodeGetCapabilities_FullMethodName:       true,
	csi.Node_NodeGetInfo_FullMethodName:               true,
	csi.Node_NodeGetVolumeStats_FullMethodName:        true,
}

// Unary returns the interceptor that logs unary calls.
func (c CallLog) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		start := time.Now()
		defer func() {
			err = c.recovered(recover(), info.FullMethod, err)
			c.done(ctx, info.FullMethod, req, resp, err, time.Since(start))
		}()
		return handler(ctx, req)
	}
}

// Stream returns the interceptor that logs streams, once each, when they end.
func (c CallLog) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		start := time.Now()
		defer func() {
			err = c.recovered(recover(), info.FullMethod, err)
			c.done(ss.Context(), info.FullMethod, nil, nil, err, time.Since(start))
		}()
		return handler(srv, ss)
	}
}

// recovered turns a handler's panic p (nil: none) into INTERNAL, logging it with its stack.
func (c CallLog) recovered(p any, method string, err error) error {
	if p == nil {
		return err
	}
	c.logger().Error("panic in handler", "method", method, "panic", p, "stack", string(debug.Stack()))
	return status.Errorf(codes.Internal, "internal error in %s", method)
}

// done logs one finished call; req and resp are nil for a stream.
func (c CallLog) done(ctx context.Context, method string, req, resp any, err error, took time.Duration) {
	log := c.logger()
	code := status.Code(err)
	level := slog.LevelInfo
	switch {
	case err == nil && c.Routine[method]:
		level = slog.LevelDebug
	case code == codes.Internal || code == codes.Unknown || code == codes.DataLoss:
		level = slog.LevelError
	case err != nil:
		level = slog.LevelWarn
	}
	debugging := log.Enabled(ctx, slog.LevelDebug)
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := []any{"method", method, "code", code.String(), "duration", took}
	if c.Attrs != nil {
		attrs = append(attrs, c.Attrs(ctx, method, req)...)
	}
	if err != nil {
		attrs = append(attrs, "err", status.Convert(err).Message())
	}
	if debugging && req != nil {
		attrs = append(attrs, "request", redacted(req))
		if err == nil && resp != nil {
			attrs = append(attrs, "response", redacted(resp))
		}
	}
	log.Log(ctx, level, "call", attrs...)
}

func (c CallLog) logger() *slog.Logger {
	if c.Log == nil {
		return slog.Default()
	}
	return c.Log
}

// redacted is m in protobuf text form with its secret metadata values redacted, or "" when m is not a
// message.
func redacted(m any) string {
	pm, ok := m.(proto.Message)
	if !ok || pm == nil {
		return ""
	}
	return prototext.MarshalOptions{}.Format(volume.StripSecrets(pm))
}
