package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestCallLogLevels: a finished call is one "call" line with its target, at debug level for a read or a
// health probe that succeeded, info for a change, warn for a caller's error and error for crustd's own.
func TestCallLogLevels(t *testing.T) {
	const target = "/kubelet/pods/p/volumes/v/mount"
	stats := &crustv1.GetVolumeStatsRequest{VolumeTargetPath: target}
	for _, c := range []struct {
		name, method string
		req          any
		err          error
		want         string // the line's level
	}{
		{"stats", crustv1.VolumeService_GetVolumeStats_FullMethodName, stats, nil, "DEBUG"},
		{"list", crustv1.VolumeService_ListVolumes_FullMethodName, &crustv1.ListVolumesRequest{}, nil, "DEBUG"},
		{"expand", crustv1.VolumeService_ExpandVolume_FullMethodName, &crustv1.ExpandVolumeRequest{VolumeTargetPath: target}, nil, "INFO"},
		{"unstage", crustv1.VolumeService_UnstageVolume_FullMethodName, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target}, nil, "INFO"},
		{"stats not found", crustv1.VolumeService_GetVolumeStats_FullMethodName, stats, status.Error(codes.NotFound, "no such volume"), "WARN"},
		{"stats internal", crustv1.VolumeService_GetVolumeStats_FullMethodName, stats, status.Error(codes.Internal, "broken"), "ERROR"},
		{"health", "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, nil, "DEBUG"},
		{"health failed", "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, status.Error(codes.NotFound, "unknown service"), "WARN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			calls := callLog(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo - 4})))
			_, err := calls.Unary()(context.Background(), c.req, &grpc.UnaryServerInfo{FullMethod: c.method},
				func(context.Context, any) (any, error) { return nil, c.err })
			if err != c.err {
				t.Fatalf("the call's error %v, want %v", err, c.err)
			}
			var lines []map[string]any
			for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
				var m map[string]any
				if len(l) > 0 && json.Unmarshal(l, &m) == nil && m["msg"] == "call" {
					lines = append(lines, m)
				}
			}
			if len(lines) != 1 || lines[0]["level"] != c.want || lines[0]["method"] != c.method {
				t.Fatalf("call lines %v; want one at %s for %s", lines, c.want, c.method)
			}
			if _, hasTarget := c.req.(interface{ GetVolumeTargetPath() string }); hasTarget && lines[0]["target"] != target {
				t.Errorf("call line %v; want target %s", lines[0], target)
			}
		})
	}
}
