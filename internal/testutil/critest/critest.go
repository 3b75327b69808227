// Package critest serves a CRI RuntimeService on a real unix socket over real gRPC, answering
// ListPodSandbox from a list a test controls and every other method UNIMPLEMENTED. It stands in for a
// container runtime's CRI socket (containerd's, CRI-O's) in tests of what reads the sandbox list.
//
// ListPodSandbox filters as the CRI API says: by exact id, by state, and by every label of the
// selector (ANDed).
package critest

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"crust.dev/crust/internal/testutil"
)

// Server is the fake runtime. Set Delay before Start; change the sandboxes at any time with Set.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	// Delay holds every answer back this long (a runtime too busy to answer).
	Delay time.Duration

	mu        sync.Mutex
	sandboxes []*runtimeapi.PodSandbox
	calls     atomic.Int64
	srv       *grpc.Server
	socket    string
}

// Sandbox is a pod sandbox of pod podUID in state ready or not ready, labelled as kubelet labels it.
func Sandbox(id, podUID string, ready bool) *runtimeapi.PodSandbox {
	state := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if ready {
		state = runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return &runtimeapi.PodSandbox{
		Id: id, State: state, CreatedAt: time.Now().UnixNano(),
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod-" + podUID, Uid: podUID, Namespace: "default"},
		Labels:   map[string]string{"io.kubernetes.pod.uid": podUID, "io.kubernetes.pod.name": "pod-" + podUID},
	}
}

// Start serves on socket (its directory is made) until the end of the test, and returns s.
func (s *Server) Start(t testing.TB, socket string) *Server {
	t.Helper()
	s.socket = socket
	s.srv = testutil.ServeGRPC(t, socket, func(g *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(g, s) })
	t.Cleanup(s.Stop)
	return s
}

// Endpoint is the runtime's address as a CRI client takes it.
func (s *Server) Endpoint() string { return "unix://" + s.socket }

// Stop stops serving and removes the socket; stopping again does nothing.
func (s *Server) Stop() {
	if s.srv == nil {
		return
	}
	s.srv.Stop()
	_ = os.Remove(s.socket)
	s.srv = nil
}

// Set replaces the runtime's sandboxes.
func (s *Server) Set(sandboxes ...*runtimeapi.PodSandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sandboxes = sandboxes
}

// Calls is how many ListPodSandbox calls the runtime received.
func (s *Server) Calls() int64 { return s.calls.Load() }

// ListPodSandbox answers the sandboxes that pass the request's filter.
func (s *Server) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	s.calls.Add(1)
	if s.Delay > 0 {
		select {
		case <-time.After(s.Delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := req.GetFilter()
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &runtimeapi.ListPodSandboxResponse{}
	for _, sb := range s.sandboxes {
		if f.GetId() != "" && sb.GetId() != f.GetId() {
			continue
		}
		if f.GetState() != nil && sb.GetState() != f.GetState().GetState() {
			continue
		}
		match := true
		for k, v := range f.GetLabelSelector() {
			if got, ok := sb.GetLabels()[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			resp.Items = append(resp.Items, proto.CloneOf(sb))
		}
	}
	return resp, nil
}
