package csiproxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"crust.dev/crust/internal/metrics"
	"crust.dev/crust/internal/validate"
)

// Stripped replaces the value of every field CSI marks csi_secret in what is logged.
const Stripped = "***stripped***"

// StripSecrets returns a copy of m in which every field marked csi_secret (at any depth; for a map,
// every value) is replaced by Stripped (strings) or cleared (other kinds), and so is every value of a
// string map (volume_context, publish_context, parameters) whose key looks secret
// (validate.IsSecretKey: kubelet's csi.storage.k8s.io/serviceAccount.tokens, an encryptionKey given as
// a StorageClass parameter). m is not modified.
func StripSecrets(m proto.Message) proto.Message {
	if m == nil {
		return nil
	}
	c := proto.Clone(m)
	strip(c.ProtoReflect())
	return c
}

func isSecret(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil {
		return false
	}
	b, _ := proto.GetExtension(opts, csi.E_CsiSecret).(bool)
	return b
}

func strip(m protoreflect.Message) {
	var secrets, maps []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case isSecret(fd):
			secrets = append(secrets, fd)
		case fd.IsMap() && fd.MapKey().Kind() == protoreflect.StringKind && fd.MapValue().Kind() == protoreflect.StringKind:
			maps = append(maps, fd)
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				strip(mv.Message())
				return true
			})
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				strip(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			strip(v.Message())
		}
		return true
	})
	for _, fd := range maps {
		mp := m.Mutable(fd).Map()
		var keys []protoreflect.MapKey
		mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			if validate.IsSecretKey(k.String()) {
				keys = append(keys, k)
			}
			return true
		})
		for _, k := range keys {
			mp.Set(k, protoreflect.ValueOfString(Stripped))
		}
	}
	for _, fd := range secrets {
		switch {
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind:
			mp := m.Mutable(fd).Map()
			var keys []protoreflect.MapKey
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool { keys = append(keys, k); return true })
			for _, k := range keys {
				mp.Set(k, protoreflect.ValueOfString(Stripped))
			}
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(Stripped))
		default:
			m.Clear(fd)
		}
	}
}

// logMessage renders a message for the log with its secrets stripped.
func logMessage(m any) string {
	pm, ok := m.(proto.Message)
	if !ok || pm == nil {
		return ""
	}
	b, err := protojson.MarshalOptions{}.Marshal(StripSecrets(pm))
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

// unaryLog is the one place typed calls are logged and counted: method, code and duration at Info
// (failures at Warn), and the request and response, secrets stripped, at Debug.
func unaryLog(log *slog.Logger, m *metrics.Metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		if log.Enabled(ctx, slog.LevelDebug) {
			log.DebugContext(ctx, "call", "method", info.FullMethod, "request", logMessage(req))
		}
		resp, err := h(ctx, req)
		st := status.Convert(err)
		elapsed := time.Since(start)
		m.ObserveRPC(info.FullMethod, st.Code().String(), elapsed)
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

// streamLog logs and counts raw-forwarded calls: method, code and duration only, never their bodies.
func streamLog(log *slog.Logger, m *metrics.Metrics) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		start := time.Now()
		err := h(srv, ss)
		st := status.Convert(err)
		elapsed := time.Since(start)
		m.ObserveRPC(info.FullMethod, st.Code().String(), elapsed)
		attrs := []any{"method", info.FullMethod, "code", st.Code().String(), "duration", elapsed, "forwarded", "raw"}
		if err != nil {
			log.Warn("call failed", append(attrs, "message", st.Message())...)
		} else {
			log.Info("call", attrs...)
		}
		return err
	}
}
