// Package handler is the library a runtime handler (a microVM shim, or any process that runs sandboxes)
// links to take part in crust's deferred mounts. It talks to crustd only through the public API
// (crust.dev/crust/api/crust/v1), so linking it pulls in nothing of the daemon.
//
// What it offers:
//   - Client (from Dial): Claim a deferred volume for a sandbox, Release it, Get one descriptor, and Watch
//     the descriptors as they come and go (resuming after a revision, SinceRevision). Claim and Release are
//     idempotent for the same sandbox: a claim repeated after a crash, or a release of a volume no longer
//     claimed, is not an error. Info says what crustd speaks: its version and the features it serves.
//   - Client.KeepClaims: claim again, whenever crustd restarts, every volume the handler still holds.
//   - ServeHandler: serve RuntimeHandlerService on a unix socket, so that crustd can forward
//     NodeGetVolumeStats and NodeExpandVolume for a claimed volume to the handler that holds it.
//   - WatchKataDir: follow the Kata direct-volume directory instead, for handlers that only read files.
//
// A handler's life with one volume:
//
//	c, _ := handler.Dial(crustd.DefaultSocket)
//	stop, endpoint, _ := handler.ServeHandler(crustd.HandlerSocket(crustd.DefaultSocket, "myhandler"), myHandler)
//	v, _ := c.Claim(ctx, targetPath, sandboxID, endpoint)   // attach v.ResolvedBackingPath, mount in the guest
//	...
//	_ = c.Release(ctx, targetPath, sandboxID)                // after unmount and unplug
//	stop()
//
// The handler's socket must lie where crustd sees it (crustd runs in a pod that mounts a few host
// directories): crustd.HandlerSocket names a path beside crustd's own socket, which it always sees.
// crustd refuses a claim whose endpoint's socket it cannot see (FailedPrecondition, naming the path).
//
// examples/microvm in crust's repository is a complete handler built on this package.
package handler

import (
	"context"
	"errors"
	"io"
	"slices"

	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
)

// DefaultSocket is crustd's default socket.
const DefaultSocket = crustd.DefaultSocket

// Client talks to crustd's RuntimeService.
type Client struct {
	conn *grpc.ClientConn
	rt   crustv1.RuntimeServiceClient
	vols crustv1.VolumeServiceClient
	info crustv1.InfoServiceClient
}

// Dial returns a client for crustd at socket (a path or unix:// address). It does not wait for crustd; the
// first call does, within its context.
func Dial(socket string) (*Client, error) {
	conn, err := crustd.Dial(socket)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, rt: crustv1.NewRuntimeServiceClient(conn), vols: crustv1.NewVolumeServiceClient(conn),
		info: crustv1.NewInfoServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Claim records that sandboxID uses the volume at targetPath and returns its descriptor. endpoint is where
// the handler serves RuntimeHandlerService (see ServeHandler), or "" when it serves no stats. Claiming again
// for the same sandbox is not an error. Errors are gRPC status errors with crust's codes (NotFound: nothing
// staged there, so the path is an ordinary volume; FailedPrecondition: another sandbox holds it, the
// device changed, or crustd cannot see endpoint's socket, whose path the message names: see
// crustd.HandlerSocket for where crustd sees one). The descriptor is whole: secret metadata (an
// encryptionKey) is there, for the handler to use and never to log; every other answer (Get, Watch)
// carries it as "<redacted>".
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

// CheckRawDevice asks crustd, before the handler hot-plugs host block device major:minor into sandboxID as
// a raw device (a container's linux.devices), whether it may: nil, or FailedPrecondition naming the holder
// (an *errdefs.HeldError through errdefs' client interceptor) while the host has it mounted, the node
// holds it, or another sandbox holds a filesystem on it. Raw devices shared between sandboxes are
// allowed. A crustd without crustd.FeatureRawDeviceCheck answers Unimplemented.
func (c *Client) CheckRawDevice(ctx context.Context, sandboxID string, major, minor uint32, readOnly bool) error {
	_, err := c.rt.CheckRawDevice(ctx, &crustv1.CheckRawDeviceRequest{SandboxId: sandboxID,
		Device: &crustv1.DeviceNumber{Major: major, Minor: minor}, ReadOnly: readOnly})
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

// Info returns what crustd speaks: its version, the API versions and the features it serves (the
// crustd.Feature* names). A crustd older than the call answers Unimplemented, and serves none of the
// features.
func (c *Client) Info(ctx context.Context) (*crustv1.GetInfoResponse, error) {
	return c.info.GetInfo(ctx, &crustv1.GetInfoRequest{})
}

// WatchOption changes what Watch asks crustd for.
type WatchOption func(*watchOptions)

type watchOptions struct {
	since *uint64
}

// SinceRevision makes Watch resume after revision, that of the last change or EVENT_TYPE_SYNCED fn was
// given (not that of an EVENT_TYPE_EXISTING: a listing is whole only at its EVENT_TYPE_SYNCED): fn is given the changes made since, as crustd sent them then, then
// EVENT_TYPE_SYNCED with resumed set, then the changes as they come. When crustd cannot resume from it
// (it no longer keeps the changes since, as after a crash of crustd: crust.proto's
// WatchVolumesResponse.revision says what survives a restart), Watch with sendExisting lists the volumes
// again instead (EVENT_TYPE_EXISTING for each, then EVENT_TYPE_SYNCED with resumed unset: drop what was
// held that they did not name), and Watch without it returns an error of kind errdefs.ErrOutOfRange at
// once. A crustd that does not resume watches (Info lists no crustd.FeatureWatchResume) counts as one
// that cannot resume; Watch asks Info first.
func SinceRevision(revision uint64) WatchOption {
	return func(o *watchOptions) { o.since = &revision }
}

// Watch calls fn for every volume event until ctx ends (then it returns nil), fn returns an error (returned
// as is) or the stream breaks (its error). With sendExisting, the first events describe every stored volume
// and are followed by EVENT_TYPE_SYNCED. SinceRevision resumes a watch instead.
func (c *Client) Watch(ctx context.Context, sendExisting bool, fn func(*crustv1.WatchVolumesResponse) error, opts ...WatchOption) error {
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	req := &crustv1.WatchVolumesRequest{SendExisting: sendExisting}
	if o.since != nil {
		resumes, err := c.resumes(ctx)
		switch {
		case err != nil:
			return err
		case resumes:
			req.SinceRevision = o.since
		case !sendExisting:
			return errdefs.Errorf(errdefs.ErrOutOfRange, "watch since revision %d: this crustd does not resume watches "+
				"(it serves no %q feature); watch with sendExisting", *o.since, crustd.FeatureWatchResume)
		}
	}
	ctx, cancel := context.WithCancel(ctx) // ends the stream however Watch returns
	defer cancel()
	stream, err := c.rt.WatchVolumes(ctx, req)
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

// resumes says whether crustd resumes watches: whether Info lists crustd.FeatureWatchResume (a crustd
// without Info does not).
func (c *Client) resumes(ctx context.Context) (bool, error) {
	info, err := c.Info(ctx)
	if errors.Is(err, errdefs.ErrUnimplemented) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.Contains(info.GetFeatures(), crustd.FeatureWatchResume), nil
}
