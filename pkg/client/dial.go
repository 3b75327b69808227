// Package client is what a CSI node plugin imports to defer the filesystem work of a volume to the
// microVM runtime that runs the pod, through crustd. It depends on crust's API, grpc and the CSI spec's
// Go types only, never on crustd's insides.
//
// Deferral is a few lines in four CSI calls:
//
//	crust, err := client.New(client.SocketFromEnv(), client.WithDriverName("lvm.example.com"))
//
//	// NodePublishVolume: a mount volume whose StorageClass says crust.dev/defer: "true".
//	if volume.Deferred(req.GetVolumeContext()) && req.GetVolumeCapability().GetMount() != nil {
//		_ = os.MkdirAll(req.GetTargetPath(), 0o750) // kubelet expects the target directory
//		return crust.Publish(ctx, req, "/dev/vg0/"+req.GetVolumeId(), client.CreateFilesystem())
//	}
//
//	// NodeUnpublishVolume, NodeGetVolumeStats, NodeExpandVolume: requests carry no volume context,
//	// so ask crustd whether it holds the path.
//	if held, err := crust.Holds(ctx, req.GetTargetPath()); err != nil || held {
//		... return crust.Unpublish(ctx, req) (Stats, Expand alike), or the error
//	}
//
// A raw block volume (a block capability) is left to the runtime, which takes the device kubelet maps;
// a driver that wants crust's handlers to attach it anyway publishes it as CSI asks and deposits it
// with the RawBlock option (Publish(ctx, req, dev, client.RawBlock())).
//
// Every method returns gRPC status errors whose codes are CSI's, so a driver returns them as they are:
// InvalidArgument for a missing or bad field (the message names it), AlreadyExists for a target published
// with other parameters, NotFound (no deferred volume of that id at that path), FailedPrecondition (a
// device smaller than the size asked, or no longer the one published), Aborted (another call on the same target is in flight), Unavailable (crustd or the runtime
// handler cannot be reached), PermissionDenied (the driver's uid is not allowed by crustd).
package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"crust.dev/crust/pkg/version"
)

// DefaultSocket is where crustd listens unless told otherwise.
const DefaultSocket = "/run/crust/crust.sock"

// SocketEnv is the environment variable that names crustd's socket; every crust binary's --crust-socket
// flag defaults to it too.
const SocketEnv = "CRUST_SOCKET"

// SocketFromEnv returns $CRUST_SOCKET, or DefaultSocket when it is unset.
func SocketFromEnv() string {
	if s := os.Getenv(SocketEnv); s != "" {
		return s
	}
	return DefaultSocket
}

// Dial returns a connection to crustd's unix socket (a path, or a unix:// address). It does not wait for
// the daemon: the first call does, honouring its context. Its user agent carries crust's version. When
// the socket cannot be connected to, the calls' Unavailable errors say what to check (DialHint): a
// missing socket means crustd is not running there, a permission denied that only root (or crustd's
// user) may connect.
func Dial(socket string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial(socket, DialHint, opts)
}

// DialUnix is Dial for a unix socket that is not crustd's (a CSI driver's, a runtime handler's): the same
// address forms and user agent, and errors without crustd's hints.
func DialUnix(socket string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial(socket, func(_ string, err error) error { return err }, opts)
}

func dial(socket string, hint func(path string, err error) error, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	target, path := socket, strings.TrimPrefix(strings.TrimPrefix(socket, "unix://"), "unix:")
	switch {
	case strings.HasPrefix(socket, "unix:"):
	case filepath.IsAbs(socket):
		target = "unix://" + socket
	default:
		target = "unix:" + socket
	}
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(version.UserAgent()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, hint(path, err)
			}
			return c, nil
		}),
	}, opts...)
	return grpc.NewClient(target, opts...)
}

// DialHint adds to err, an error connecting to crustd's socket at path, what to check: for a missing
// socket, that crustd is not running there (and the flag and variable that name the socket); for a
// permission denied, who may connect. Other errors are returned as they are.
func DialHint(path string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("%w: no crustd is serving at %s: start crustd, or name its socket with --crust-socket or %s", err, path, SocketEnv)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w: %s exists but no crustd is listening on it: start crustd, or name its socket with --crust-socket or %s", err, path, SocketEnv)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return fmt.Errorf("%w: crustd's socket %s admits its owner only (mode 0600): run as root, "+
			"and check that crustd's --allow-uid/--allow-gid admit uid %d gid %d", err, path, os.Getuid(), os.Getgid())
	}
	return err
}
