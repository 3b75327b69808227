// Package forward takes stats and expansion requests for a claimed volume to the runtime handler that
// claimed it: over the handler's RuntimeHandlerService socket, or, for a claim read from a Kata sandbox-id
// file or found through the CRI runtime (claim.kata), over that Kata shim's management socket. The
// claim alone decides which: the caller hands over the claimed volume and need not know.
//
// Promises for handlers: a handler that cannot be reached is ErrUnavailable (the descriptor and its claim
// are kept, so a restarted handler answers again); a handler's own error keeps its gRPC code and message;
// connections are reused per endpoint and closed by Close.
//
// Promises for Kata shims: the request goes to the shim of claim.sandbox_id, found under KataShimDirs
// (the Go runtime's socket first, then runtime-rs's), and names the volume by the host device its
// mountInfo.json holds (the backing path as resolved at stage time), as Kata's shim expects; stats are
// asked by GET, and again by POST of a shim that answers 404 or 405 (runtime-rs). Stats are Kata's numbers (absent ones
// are zero); ExpandVolume answers required_bytes on success, since Kata reports no capacity. Failures map
// to kinds, and the message always carries the shim's own text:
//
//	no socket answers                                ErrUnavailable
//	HTTP 400                                         ErrInvalidArgument
//	HTTP 500 whose text says unimplemented or        ErrUnimplemented (a real Kata answers every resize
//	  not implemented, HTTP 501, HTTP 404 or 405       so today)
//	the context ends first                           the context's error
//	a sandbox id that is no file name                ErrFailedPrecondition
//	any other answer                                 a plain error (INTERNAL)
package forward

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/version"
)

// Forwarder dials handlers and Kata shims. The zero value is ready to use.
type Forwarder struct {
	// KataShimDirs are the directories holding one directory per Kata sandbox, searched in order for
	// <dir>/<sandbox id>/shim-monitor.sock; empty means kata.DefaultShimDirs (/run/vc/sbs, /run/kata).
	// Set it before the first call.
	KataShimDirs []string

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// Stats asks the claiming handler for the volume's usage inside its sandbox.
func (f *Forwarder) Stats(ctx context.Context, v *crustv1.Volume) (*crustv1.GetVolumeStatsResponse, error) {
	if v.GetClaim().GetKata() {
		return f.kataStats(ctx, v)
	}
	c, err := f.client(v)
	if err != nil {
		return nil, err
	}
	r, err := c.GetVolumeStats(ctx, &crustv1.RuntimeHandlerServiceGetVolumeStatsRequest{
		VolumeTargetPath: v.GetSpec().GetVolumeTargetPath(),
		SandboxId:        v.GetClaim().GetSandboxId(),
	})
	if err != nil {
		return nil, f.handlerError(v, err)
	}
	return &crustv1.GetVolumeStatsResponse{Usage: r.GetUsage(), VolumeCondition: r.GetVolumeCondition()}, nil
}

// Expand asks the claiming handler to grow the volume online to at least requiredBytes.
func (f *Forwarder) Expand(ctx context.Context, v *crustv1.Volume, requiredBytes, deviceBytes int64) (int64, error) {
	if v.GetClaim().GetKata() {
		return f.kataExpand(ctx, v, requiredBytes)
	}
	c, err := f.client(v)
	if err != nil {
		return 0, err
	}
	r, err := c.ExpandVolume(ctx, &crustv1.RuntimeHandlerServiceExpandVolumeRequest{
		VolumeTargetPath: v.GetSpec().GetVolumeTargetPath(),
		SandboxId:        v.GetClaim().GetSandboxId(),
		RequiredBytes:    requiredBytes,
		DeviceBytes:      deviceBytes,
	})
	if err != nil {
		return 0, f.handlerError(v, err)
	}
	return r.GetCapacityBytes(), nil
}

// Close closes every connection.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ep, c := range f.conns {
		_ = c.Close()
		delete(f.conns, ep)
	}
	return nil
}

func (f *Forwarder) client(v *crustv1.Volume) (crustv1.RuntimeHandlerServiceClient, error) {
	claim := v.GetClaim()
	if claim.GetHandlerEndpoint() == "" {
		return nil, fmt.Errorf("volume %q is used by sandbox %q, which gave no handler endpoint: %w",
			v.GetSpec().GetVolumeTargetPath(), claim.GetSandboxId(), errdefs.ErrFailedPrecondition)
	}
	ep := claim.GetHandlerEndpoint()
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.conns[ep]; ok {
		return crustv1.NewRuntimeHandlerServiceClient(c), nil
	}
	c, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent(version.UserAgent()))
	if err != nil {
		return nil, fmt.Errorf("handler endpoint %q: %v: %w", ep, err, errdefs.ErrUnavailable)
	}
	if f.conns == nil {
		f.conns = map[string]*grpc.ClientConn{}
	}
	f.conns[ep] = c
	return crustv1.NewRuntimeHandlerServiceClient(c), nil
}

// handlerError keeps the handler's code, except that an unreachable handler is named as such and its
// connection dropped, so that the next call dials afresh instead of waiting out a reconnect backoff (a
// restarted handler answers at once).
func (f *Forwarder) handlerError(v *crustv1.Volume, err error) error {
	err = errdefs.FromGRPC(err)
	if errors.Is(err, errdefs.ErrUnavailable) {
		ep := v.GetClaim().GetHandlerEndpoint()
		f.mu.Lock()
		if c, ok := f.conns[ep]; ok {
			_ = c.Close()
			delete(f.conns, ep)
		}
		f.mu.Unlock()
		return fmt.Errorf("handler of sandbox %q at %s: %w", v.GetClaim().GetSandboxId(), ep, err)
	}
	return fmt.Errorf("handler of sandbox %q: %w", v.GetClaim().GetSandboxId(), err)
}
