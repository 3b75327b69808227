package csiproxy_test

import (
	"errors"
	"net"
	"os"
)

// listenUnix listens on a unix socket at path, replacing a stale one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}
