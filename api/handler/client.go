// Package handler is the library a runtime handler (a microVM shim, or any process that runs sandboxes)
// links to take part in crust's deferred mounts. It talks to crustd only through the public API
// (crust.dev/crust/api/crust/v1), so linking it pulls in nothing of the daemon.
//
// What it offers:
//   - Client (from Dial): Claim a deferred volume for a sandbox, Release it, Get one descriptor, and Watch
//     the descriptors as they come and go. Claim and Release are idempotent for the same sandbox: a claim
//     repeated after a crash, or a release of a volume no longer claimed, is not an error.
//   - Client.KeepClaims: claim again, whenever crustd restarts, every volume the handler still holds.
//   - ServeHandler: serve RuntimeHandlerService on a unix socket, so that crustd can forward
//     NodeGetVolumeStats and NodeExpandVolume for a claimed volume to the handler that holds it.
//   - WatchKataDir: follow the Kata direct-volume directory instead, for handlers that only read files.
//
// A handler's life with one volume:
//
//	c, _ := handler.Dial(crustd.DefaultSocket)
//	stop, endpoint, _ := handler.ServeHandler("/run/myhandler/crust.sock", myHandler)
//	v, _ := c.Claim(ctx, targetPath, sandboxID, endpoint)   // attach v.ResolvedBackingPath, mount in the guest
//	...
//	_ = c.Release(ctx, targetPath, sandboxID)                // after unmount and unplug
//	stop()
//
// examples/microvm in crust's repository is a complete handler built on this package.
package handler

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
)

// DefaultSocket is crustd's default socket.
const DefaultSocket = crustd.DefaultSocket

// Client talks to crustd's RuntimeService.
type Client struct {
	conn *grpc.ClientConn
	rt   crustv1.RuntimeServiceClient
	vols crustv1.VolumeServiceClient
}

// Dial returns a client for crustd at socket (a path or unix:// address). It does not wait for crustd; the
// first call does, within its context.
func Dial(socket string) (*Client, error) {
	conn, err := crustd.Dial(socket)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, rt: crustv1.NewRuntimeServiceClient(conn), vols: crustv1.NewVolumeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Claim records that sandboxID uses the volume at targetPath and returns its descriptor. endpoint is where
// the handler serves RuntimeHandlerService (see ServeHandler), or "" when it serves no stats. Claiming again
// for the same sandbox is not an error. Errors are gRPC status errors with crust's codes (NotFound: nothing
// staged there, so the path is an ordinary volume; FailedPrecondition: another sandbox holds it or the
// device changed). The descriptor is whole: secret metadata (an encryptionKey) is there, for the handler
// to use and never to log; every other answer (Get, Watch) carries it as "<redacted>".
func (c *Client) Claim(ctx context.Context, targetPath, sandboxID, endpoint string) (*crustv1.Volume, error) {
	r, err := c.rt.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{
		VolumeTargetPath: targetPath, SandboxId: sandboxID, HandlerEndpoint: endpoint,
	})
	if err != nil {
		return nil, err
	}
	return r.GetVolume(), nil
}

// Release ends sandboxID's claim; a volume that is not claimed, or not known, is not an error.
func (c *Client) Release(ctx context.Context, targetPath, sandboxID string) error {
	_, err := c.rt.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: targetPath, SandboxId: sandboxID})
	return err
}

// Get returns the descriptor at targetPath, with secret metadata values redacted (see Claim).
func (c *Client) Get(ctx context.Context, targetPath string) (*crustv1.Volume, error) {
	r, err := c.vols.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: targetPath})
	if err != nil {
		return nil, err
	}
	return r.GetVolume(), nil
}

// Watch calls fn for every volume event until ctx ends (then it returns nil), fn returns an error (returned
// as is) or the stream breaks (its error). With sendExisting, the first events describe every stored volume
// and are followed by EVENT_TYPE_SYNCED.
func (c *Client) Watch(ctx context.Context, sendExisting bool, fn func(*crustv1.WatchVolumesResponse) error) error {
	stream, err := c.rt.WatchVolumes(ctx, &crustv1.WatchVolumesRequest{SendExisting: sendExisting})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}
