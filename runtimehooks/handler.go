package runtimehooks

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"google.golang.org/grpc"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
)

var umaskMu sync.Mutex

// ServeHandler serves h as RuntimeHandlerService on a unix socket at path (created 0600; a stale socket is
// replaced) and returns a function that stops it and the endpoint to pass to Claim. crustd runs as root, so
// a 0600 socket owned by the handler's user is reachable by crustd and nobody else.
func ServeHandler(path string, h crustv1.RuntimeHandlerServiceServer) (stop func(), endpoint string, err error) {
	if !filepath.IsAbs(path) {
		return nil, "", fmt.Errorf("handler socket %q: must be an absolute path", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, "", err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, "", err
	}
	umaskMu.Lock()
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, "", err
	}
	s := grpc.NewServer()
	crustv1.RegisterRuntimeHandlerServiceServer(s, h)
	done := make(chan struct{})
	go func() { _ = s.Serve(l); close(done) }()
	return func() { s.Stop(); <-done }, "unix://" + path, nil
}
