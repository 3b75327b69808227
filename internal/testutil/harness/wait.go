package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Poll calls cond until it reports done or ctx ends. Between tries it waits a pause that starts at a
// millisecond and doubles up to 100 ms, so that a condition met at once costs nothing and a slow one is
// not asked in a busy loop. An error from cond is not the end: it is the reason of "not yet", which
// Poll reports with ctx's error when ctx ends first. Nil when cond was done.
func Poll(ctx context.Context, cond func() (done bool, err error)) error {
	pause := time.Millisecond
	for {
		done, err := cond()
		if done {
			return nil
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			if err != nil {
				return fmt.Errorf("%w (last try: %v)", ctx.Err(), err)
			}
			return ctx.Err()
		case <-timer.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// Eventually polls cond (as Poll does) for at most timeout, or the test's deadline when that comes
// first, and fails t, saying what it waited for, when cond is not true by then.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := Context(t, timeout)
	defer cancel()
	if err := Poll(ctx, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waited %s for %s: %v", timeout, what, err)
	}
}

// Context is a context that ends after timeout, or a little before the test's deadline when that comes
// first (so that the test fails with its own message rather than the test binary's panic).
func Context(t testing.TB, timeout time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(timeout)
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if td, ok := d.Deadline(); ok && td.Add(-5*time.Second).Before(deadline) {
			deadline = td.Add(-5 * time.Second)
		}
	}
	return context.WithDeadline(context.Background(), deadline)
}

// dial connects to a unix socket that may not exist yet: gRPC tries again with a short back-off (10 ms
// growing to 100 ms), so a wait for readiness follows the server's start closely.
func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
}

// WaitServing waits until the gRPC health service on socket reports SERVING for the whole server. It
// follows the service's Watch stream (no polling of its own), and gives up with an error when ctx ends or
// exited (a process's exit, nil for none) is closed first: a server that crashes at start fails the wait
// at once.
func WaitServing(ctx context.Context, socket string, exited <-chan struct{}) error {
	return waitConn(ctx, socket, exited, func(ctx context.Context, cc *grpc.ClientConn) error {
		w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		for {
			r, err := w.Recv()
			if err != nil {
				return err
			}
			if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				return nil
			}
		}
	})
}

// WaitCSI waits until the CSI endpoint on socket answers GetPluginInfo (a CSI plugin has no health
// service), with the same promises as WaitServing.
func WaitCSI(ctx context.Context, socket string, exited <-chan struct{}) error {
	return waitConn(ctx, socket, exited, func(ctx context.Context, cc *grpc.ClientConn) error {
		return Poll(ctx, func() (bool, error) { // a plugin may listen before it answers
			_, err := csi.NewIdentityClient(cc).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
			return err == nil, err
		})
	})
}

// HTTPGet returns the status code and body of GET http://addr/path, failing t when there is no answer.
func HTTPGet(t testing.TB, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Serving is a ProcConfig.Ready: WaitServing on socket.
func Serving(socket string) func(ctx context.Context, exited <-chan struct{}) error {
	return func(ctx context.Context, exited <-chan struct{}) error { return WaitServing(ctx, socket, exited) }
}

// AnswersCSI is a ProcConfig.Ready: WaitCSI on socket.
func AnswersCSI(socket string) func(ctx context.Context, exited <-chan struct{}) error {
	return func(ctx context.Context, exited <-chan struct{}) error { return WaitCSI(ctx, socket, exited) }
}

// waitConn runs wait on a connection to socket, ending it when exited is closed.
func waitConn(ctx context.Context, socket string, exited <-chan struct{}, wait func(context.Context, *grpc.ClientConn) error) error {
	cc, err := dial(socket)
	if err != nil {
		return err
	}
	defer func() { _ = cc.Close() }()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if exited != nil {
		go func() {
			select {
			case <-exited:
				cancel(errors.New("the process exited"))
			case <-ctx.Done():
			}
		}()
	}
	if err := wait(ctx, cc); err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return fmt.Errorf("%s: %w (%v)", socket, cause, err)
		}
		return fmt.Errorf("%s: %w", socket, err)
	}
	return nil
}
