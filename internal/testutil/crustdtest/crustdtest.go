// Package crustdtest runs a real crustd inside a test binary, for the tests and examples of packages that
// talk to crustd and need no separate process: the daemon is internal/daemon, served on a unix socket
// under a temporary directory, exactly as cmd/crustd serves it.
package crustdtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil/harness"
)

// Config returns crustd's defaults with every path under root: the socket root/run/crust.sock, the state
// root/crustd, the kubelet directory root/kubelet (its pods/ made), no Kata directory and no HTTP
// endpoint.
func Config(root string) (daemon.Config, error) {
	cfg := daemon.Defaults()
	cfg.Socket, cfg.StateDir, cfg.KataDir = filepath.Join(root, "run", "crust.sock"), filepath.Join(root, "crustd"), ""
	cfg.KubeletDir, cfg.HTTPAddr = filepath.Join(root, "kubelet"), ""
	return cfg, os.MkdirAll(filepath.Join(cfg.KubeletDir, "pods"), 0o750)
}

// ImageDir is where FileConfig lets volumes' image files be, under its root.
const ImageDir = "images"

// FileConfig is Config for volumes that are image files (VOLUME_TYPE_FILE) under root/ImageDir, which it
// makes, called by this process's user: what a test or an example needs to run without root.
func FileConfig(root string) (daemon.Config, error) {
	cfg, err := Config(root)
	if err != nil {
		return cfg, err
	}
	images := filepath.Join(root, ImageDir)
	cfg.DeviceAllow = []string{images + "/*"}
	cfg.AllowFileBacked = true
	cfg.AllowUIDs = []uint32{uint32(os.Geteuid())}
	return cfg, os.MkdirAll(images, 0o755)
}

// Start runs crustd with cfg until stop is called, and returns once it serves (its health service says
// so), or with the reason it did not within a minute. stop ends crustd and returns what it returned. A nil
// log discards crustd's log.
func Start(cfg daemon.Config, log *slog.Logger) (stop func() error, err error) {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		runErr = daemon.Run(ctx, cfg, log)
	}()
	stop = func() error { cancel(); <-exited; return runErr }
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	if err := harness.WaitServing(wctx, cfg.Socket, exited); err != nil {
		if serr := stop(); serr != nil {
			err = serr
		}
		return nil, fmt.Errorf("crustd did not come up: %w", err)
	}
	return stop, nil
}

// StartT is Start for one test: it fails t when crustd does not come up, and stops crustd when t ends,
// failing t when crustd returned an error.
func StartT(t testing.TB, cfg daemon.Config, log *slog.Logger) {
	t.Helper()
	stop, err := Start(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("crustd: %v", err)
		}
	})
}
