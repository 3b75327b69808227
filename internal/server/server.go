// Package server serves crust's gRPC API on a unix socket: VolumeService, RuntimeService, InfoService and
// the standard health service. It is the one place where domain errors become gRPC status codes, where
// callers are authorised (SO_PEERCRED against an allow-list) and where requests are logged (one
// interceptor, secrets redacted) and counted.
//
// Promises: the socket is created with mode 0600 (by api/unixsocket, so it never exists with a wider
// mode); a caller whose uid and gid are both off the allow-list gets PERMISSION_DENIED for every call
// except health checks; a request that does not decode (a string that is not UTF-8, bytes that are not
// the message) is answered with INVALID_ARGUMENT naming the field; a panic in a handler is answered with
// INTERNAL and does not bring the daemon down.
package server

import (
	"context"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/metrics"
	"crust.dev/crust/internal/peercred"
	"crust.dev/crust/pkg/command"
)

// MaxMessageBytes bounds a request; a descriptor is a few hundred bytes, so this is generous.
const MaxMessageBytes = 256 << 10

// Annotator adds to a volume in an answer what a runtime's adapter has to say of it (the Kata adapter:
// its caveats). It returns v, or a copy: v is shared with watchers and is never changed.
type Annotator interface {
	Annotate(v *crustv1.Volume) *crustv1.Volume
}

// Config is what the server needs.
type Config struct {
	Manager *manager.Manager
	// Annotators fill the volumes of the StageVolume, GetVolume, ListVolumes and WatchVolumes answers,
	// in this order; none of them is stored.
	Annotators []Annotator
	Policy     peercred.Policy
	Metrics    *metrics.Metrics // nil: not counted
	// Features are the features this crustd serves, as GetInfo names them (api/crustd's Feature*
	// constants); GetInfo answers them sorted.
	Features []string
	Log      *slog.Logger
}

// Server is a configured gRPC server with its health service.
type Server struct {
	GRPC   *grpc.Server
	Health *health.Server
}

// New builds the server. Its health service reports NOT_SERVING for "" and every crust service until
// SetServing(true), so that a caller that waits for SERVING waits for the whole daemon (its HTTP
// endpoints too), not only for the gRPC listener.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ic := &interceptors{policy: cfg.Policy, codec: newRequestCodec()}
	calls := callLog(cfg.Log)
	var counting struct { // first in the chains, so that they count the code the caller is sent
		unary  []grpc.UnaryServerInterceptor
		stream []grpc.StreamServerInterceptor
	}
	if cfg.Metrics != nil {
		counting.unary = append(counting.unary, cfg.Metrics.UnaryServerInterceptor())
		counting.stream = append(counting.stream, cfg.Metrics.StreamServerInterceptor())
	}
	g := grpc.NewServer(
		grpc.Creds(peercred.New()),
		grpc.ForceServerCodecV2(ic.codec),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		command.StreamWorkers(),
		grpc.ChainUnaryInterceptor(append(counting.unary, calls.Unary(), errdefs.UnaryServerInterceptor, ic.unary)...),
		grpc.ChainStreamInterceptor(append(counting.stream, calls.Stream(), errdefs.StreamServerInterceptor, ic.stream)...),
	)
	out := answers(cfg.Annotators)
	crustv1.RegisterVolumeServiceServer(g, &volumes{m: cfg.Manager, out: out, metrics: cfg.Metrics})
	crustv1.RegisterRuntimeServiceServer(g, &runtime{m: cfg.Manager, out: out})
	crustv1.RegisterInfoServiceServer(g, newInfo(cfg.Features))
	s := &Server{GRPC: g, Health: health.NewServer()} // which says SERVING for "" from the start
	s.SetServing(false)
	healthpb.RegisterHealthServer(g, s.Health)
	return s
}

// serviceNames are the names the health service answers for: "" (the whole server) and every crust
// service served.
var serviceNames = []string{"", crustv1.VolumeService_ServiceDesc.ServiceName, crustv1.RuntimeService_ServiceDesc.ServiceName,
	crustv1.InfoService_ServiceDesc.ServiceName}

// SetServing marks the server and every crust service as serving (true) or not (false).
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range serviceNames {
		s.Health.SetServingStatus(name, st)
	}
}

// interceptors are crustd's own steps of every call, inside the call log and errdefs' conversion: the caller's credentials and
// the request's decoding.
type interceptors struct {
	policy peercred.Policy
	codec  *requestCodec
}

func (ic *interceptors) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	bad := ic.codec.take(req) // taken before anything can return, so that nothing is left behind
	if err := ic.authorise(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	if bad != nil {
		return nil, bad
	}
	return handler(ctx, req)
}

func (ic *interceptors) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := ic.authorise(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, checkedStream{ServerStream: ss, codec: ic.codec})
}

func (ic *interceptors) authorise(ctx context.Context, method string) error {
	if strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return nil // reveals nothing; probes run as anyone
	}
	cred, ok := peercred.FromContext(ctx)
	if !ok {
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "caller credentials unknown: crust serves only unix sockets")
	}
	if !ic.policy.Allowed(cred) {
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "caller uid %d gid %d is not allowed (crustd --allow-uid/--allow-gid)", cred.Uid, cred.Gid)
	}
	return nil
}

// routine are the calls whose successes are logged at debug level: the reads, which change nothing
// (kubelet asks for the stats of every volume every minute, and a line each would bury the changes),
// and the health probes.
var routine = map[string]bool{
	crustv1.VolumeService_GetVolume_FullMethodName:      true,
	crustv1.VolumeService_ListVolumes_FullMethodName:    true,
	crustv1.VolumeService_GetVolumeStats_FullMethodName: true,
	crustv1.VolumeService_ListProblems_FullMethodName:   true,
	crustv1.VolumeService_ListNodeHolds_FullMethodName:  true,
	crustv1.InfoService_GetInfo_FullMethodName:          true,
	healthpb.Health_Check_FullMethodName:                true,
	healthpb.Health_Watch_FullMethodName:                true,
	healthpb.Health_List_FullMethodName:                 true,
}

// callLog is crustd's call log: routine calls at debug level, lines with callAttrs.
func callLog(log *slog.Logger) command.CallLog {
	return command.CallLog{Log: log, Routine: routine, Attrs: callAttrs}
}

// callAttrs are what crustd's call lines carry besides the method, code and duration: the volume's
// target path and the caller's uid and pid.
func callAttrs(ctx context.Context, _ string, req any) []any {
	var attrs []any
	if t := targetOf(req); t != "" {
		attrs = append(attrs, "target", t)
	}
	if cred, ok := peercred.FromContext(ctx); ok {
		attrs = append(attrs, "uid", cred.Uid, "pid", cred.Pid)
	}
	return attrs
}

func targetOf(req any) string {
	switch r := req.(type) {
	case interface{ GetVolumeTargetPath() string }:
		return r.GetVolumeTargetPath()
	case *crustv1.StageVolumeRequest:
		return r.GetSpec().GetVolumeTargetPath()
	case *crustv1.HoldForNodeRequest:
		return r.GetHold().GetVolumeTargetPath()
	}
	return ""
}
