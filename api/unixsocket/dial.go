package unixsocket

import (
	"context"
	"net"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/version"
)

// Dial returns a gRPC connection to the unix socket at socket (a path, or a unix:// or unix: address). It
// does not wait for the server: the first call does, honouring its context. Its user agent carries
// crust's version, and its calls answer errors of errdefs' kinds (errdefs.UnaryClientInterceptor), which
// still carry their gRPC status. hint, when not nil, is given every error connecting to the socket's path
// and returns the error to report (crustd.DialHint says what to check); opts come after Dial's own.
func Dial(socket string, hint func(path string, err error) error, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
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
		grpc.WithChainUnaryInterceptor(errdefs.UnaryClientInterceptor),
		grpc.WithChainStreamInterceptor(errdefs.StreamClientInterceptor),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil && hint != nil {
				return nil, hint(path, err)
			}
			return c, err
		}),
	}, opts...)
	return grpc.NewClient(target, opts...)
}
