package handler

import (
	"fmt"
	"path/filepath"

	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/unixsocket"
)

// ServeHandler serves h as RuntimeHandlerService on a unix socket at path (created 0600 by unixsocket.Listen: a stale
// socket is replaced, a live one is an error) and returns a function that stops it and the endpoint to pass to Claim. crustd runs as root, so
// a 0600 socket owned by the handler's user is reachable by crustd and nobody else.
func ServeHandler(path string, h crustv1.RuntimeHandlerServiceServer) (stop func(), endpoint string, err error) {
	if !filepath.IsAbs(path) {
		return nil, "", fmt.Errorf("handler socket %q: must be an absolute path", path)
	}
	l, err := unixsocket.Listen(path)
	if err != nil {
		return nil, "", err
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(errdefs.UnaryServerInterceptor), grpc.ChainStreamInterceptor(errdefs.StreamServerInterceptor))
	crustv1.RegisterRuntimeHandlerServiceServer(s, h)
	done := make(chan struct{})
	go func() { _ = s.Serve(l); close(done) }()
	return func() { s.Stop(); <-done }, "unix://" + path, nil
}
