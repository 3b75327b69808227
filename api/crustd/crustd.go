// Package crustd says where crustd serves its API and connects to it: the socket's default path and
// variable, and a gRPC connection whose failures to connect say what to check. The driver library
// (api/client) and the handler library (api/handler) both connect through it.
package crustd

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"google.golang.org/grpc"

	"crust.dev/crust/api/unixsocket"
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

// Dial returns a connection to crustd's unix socket (a path, or a unix:// address), as unixsocket.Dial
// makes it. When the socket cannot be connected to, the calls' Unavailable errors say what to check
// (DialHint): a missing socket means crustd is not running there, a permission denied that only root (or
// crustd's user) may connect.
func Dial(socket string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return unixsocket.Dial(socket, DialHint, opts...)
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
