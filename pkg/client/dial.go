// Package client is what a CSI node plugin (or any other caller) imports to talk to crustd. It depends on
// the API and grpc only, never on crustd's insides.
package client

import (
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultSocket is where crustd listens unless told otherwise.
const DefaultSocket = "/run/crust/crust.sock"

// SocketFromEnv returns $CRUST_SOCKET, or DefaultSocket when it is unset.
func SocketFromEnv() string {
	if s := os.Getenv("CRUST_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// Dial returns a connection to crustd's unix socket (a path, or a unix:// address). It does not wait for
// the daemon: the first call does, honouring its context.
func Dial(socket string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	target := socket
	switch {
	case strings.HasPrefix(socket, "unix:"):
	case filepath.IsAbs(socket):
		target = "unix://" + socket
	default:
		target = "unix:" + socket
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	return grpc.NewClient(target, opts...)
}
