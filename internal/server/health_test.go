package server

import (
	"context"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	crustv1 "crust.dev/crust/api/crust/v1"
)

// TestHealthWaitsForSetServing: the health service says NOT_SERVING for the server and each crust service
// until SetServing(true), and again after SetServing(false); a readiness wait on it must not end while
// crustd is still starting its other listeners.
func TestHealthWaitsForSetServing(t *testing.T) {
	s := New(Config{})
	check := func(when string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, name := range []string{"", crustv1.VolumeService_ServiceDesc.ServiceName, crustv1.RuntimeService_ServiceDesc.ServiceName,
			crustv1.InfoService_ServiceDesc.ServiceName} {
			r, err := s.Health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
			if err != nil || r.GetStatus() != want {
				t.Errorf("%s: service %q is %v (%v), want %v", when, name, r.GetStatus(), err, want)
			}
		}
	}
	check("new", healthpb.HealthCheckResponse_NOT_SERVING)
	s.SetServing(true)
	check("after SetServing(true)", healthpb.HealthCheckResponse_SERVING)
	s.SetServing(false)
	check("after SetServing(false)", healthpb.HealthCheckResponse_NOT_SERVING)
}
