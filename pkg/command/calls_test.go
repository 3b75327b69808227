package command_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/pkg/command"
)

// logLines decodes buf's JSON log lines.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestCallLogUnary: one "call" line a call, its level by how it went and whether the method is routine,
// the server's attributes on it, the status message of a failure as "err"; at debug level the request
// and the response with their secrets redacted; a panic is an error line with its stack and INTERNAL.
func TestCallLogUnary(t *testing.T) {
	const secret = "s3cr3t"
	stage := &csi.NodeStageVolumeRequest{VolumeId: "v1", Secrets: map[string]string{"password": secret},
		VolumeContext: map[string]string{"encryptionKey": secret, "size": "1Gi"}}
	for _, c := range []struct {
		name, method string
		level        string // the slog level of the logger
		handler      func() (any, error)
		wantLevel    string
		wantCode     codes.Code
		wantErr      string // the line's "err"
		wantBodies   bool   // request and response on the line
	}{
		{name: "change", method: csi.Node_NodeStageVolume_FullMethodName, level: "info",
			handler: func() (any, error) { return &csi.NodeStageVolumeResponse{}, nil }, wantLevel: "INFO"},
		{name: "routine", method: csi.Identity_Probe_FullMethodName, level: "debug",
			handler: func() (any, error) { return &csi.ProbeResponse{}, nil }, wantLevel: "DEBUG", wantBodies: true},
		{name: "change at debug", method: csi.Node_NodeStageVolume_FullMethodName, level: "debug",
			handler: func() (any, error) { return &csi.NodeStageVolumeResponse{}, nil }, wantLevel: "INFO", wantBodies: true},
		{name: "routine failed", method: csi.Identity_Probe_FullMethodName, level: "info",
			handler:   func() (any, error) { return nil, status.Error(codes.FailedPrecondition, "not ready") },
			wantLevel: "WARN", wantCode: codes.FailedPrecondition, wantErr: "not ready"},
		{name: "internal", method: csi.Node_NodeStageVolume_FullMethodName, level: "info",
			handler:   func() (any, error) { return nil, status.Error(codes.Internal, "disk on fire") },
			wantLevel: "ERROR", wantCode: codes.Internal, wantErr: "disk on fire"},
		{name: "panic", method: csi.Node_NodeStageVolume_FullMethodName, level: "info",
			handler:   func() (any, error) { panic("boom") },
			wantLevel: "ERROR", wantCode: codes.Internal, wantErr: "internal error in " + csi.Node_NodeStageVolume_FullMethodName},
	} {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := command.Logging{Level: c.level, Format: "json"}.Logger(&buf)
			if err != nil {
				t.Fatal(err)
			}
			calls := command.CallLog{Log: log, Routine: command.RoutineCSI,
				Attrs: func(_ context.Context, _ string, req any) []any {
					return []any{"volume", req.(interface{ GetVolumeId() string }).GetVolumeId()}
				}}
			_, err = calls.Unary()(context.Background(), stage, &grpc.UnaryServerInfo{FullMethod: c.method},
				func(context.Context, any) (any, error) { return c.handler() })
			if status.Code(err) != c.wantCode {
				t.Fatalf("the call's error %v, want code %s", err, c.wantCode)
			}
			var call map[string]any
			panics := 0
			for _, l := range logLines(t, &buf) {
				switch l["msg"] {
				case "call":
					if call != nil {
						t.Fatalf("two call lines: %v and %v", call, l)
					}
					call = l
				case "panic in handler":
					panics++
					if !strings.Contains(l["stack"].(string), "calls_test.go") {
						t.Errorf("the panic's line has no stack through the handler: %v", l)
					}
				}
			}
			if call == nil || call["level"] != c.wantLevel || call["method"] != c.method || call["code"] != c.wantCode.String() ||
				call["volume"] != "v1" || call["duration"] == nil {
				t.Fatalf("call line %v; want level %s, method %s, code %s, volume v1, a duration", call, c.wantLevel, c.method, c.wantCode)
			}
			if got, _ := call["err"].(string); got != c.wantErr {
				t.Errorf("err %q, want %q", got, c.wantErr)
			}
			if (c.name == "panic") != (panics == 1) {
				t.Errorf("%d panic lines", panics)
			}
			req, hasReq := call["request"].(string)
			if hasReq != c.wantBodies || (c.wantBodies && (!strings.Contains(req, `volume_id:"v1"`) || !strings.Contains(req, "<redacted>"))) {
				t.Errorf("request %q (on the line: %v), want it at debug level only, redacted", req, hasReq)
			}
			if _, hasResp := call["response"]; hasResp != c.wantBodies {
				t.Errorf("response on the line: %v, want %v", hasResp, c.wantBodies)
			}
			if strings.Contains(buf.String(), secret) {
				t.Errorf("the log holds a secret:\n%s", buf.String())
			}
		})
	}
}

// TestCallLogStream: a stream is one line when it ends, with the server's attributes for a call without
// a request.
func TestCallLogStream(t *testing.T) {
	var buf bytes.Buffer
	log, err := command.Logging{Format: "json"}.Logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	calls := command.CallLog{Log: log, Attrs: func(_ context.Context, _ string, req any) []any {
		if req == nil {
			return []any{"forwarded", "raw"}
		}
		return nil
	}}
	err = calls.Stream()(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/x.v1.S/Watch"},
		func(any, grpc.ServerStream) error { return status.Error(codes.Unavailable, "gone") })
	lines := logLines(t, &buf)
	if status.Code(err) != codes.Unavailable || len(lines) != 1 || lines[0]["msg"] != "call" || lines[0]["level"] != "WARN" ||
		lines[0]["forwarded"] != "raw" || lines[0]["err"] != "gone" {
		t.Fatalf("stream ended with %v and logged %v; want one warn call line, forwarded raw, err gone", err, lines)
	}
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }
