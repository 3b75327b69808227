package client_test

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

// The tests and the example run against a real crustd, in this process (a test may import the daemon; the
// package itself never does). Volumes are image files (VOLUME_TYPE_FILE), so that no root is needed.
var (
	socket     string // crustd's socket
	kubeletDir string // crustd's --kubelet-dir
	imageDir   string // where images are made; --device-allow imageDir/*
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	root, err := os.MkdirTemp("", "crust-client")
	if err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(root) }()
	socket = filepath.Join(root, "run", "crust.sock")
	kubeletDir = filepath.Join(root, "kubelet")
	imageDir = filepath.Join(root, "images")
	for _, d := range []string{filepath.Join(kubeletDir, "pods"), imageDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			panic(err)
		}
	}
	cfg := daemon.Defaults()
	cfg.Socket, cfg.StateDir, cfg.KataDir, cfg.KubeletDir = socket, filepath.Join(root, "state"), "", kubeletDir
	cfg.DeviceAllow = []string{imageDir + "/*"}
	cfg.AllowFileBacked = true
	cfg.AllowUIDs = []uint32{uint32(os.Geteuid())}
	cfg.HTTPAddr = ""
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		runErr = daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() { cancel(); <-exited }()
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	if err := harness.WaitServing(wctx, socket, exited); err != nil {
		select {
		case <-exited:
			fmt.Println("crustd:", err, runErr)
		default:
			fmt.Println("crustd:", err)
		}
		return 1
	}
	_ = os.Setenv("CRUST_SOCKET", socket)
	return m.Run()
}

// image makes a 64 MiB sparse image file, a stand-in for a block device.
func image(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(imageDir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(p) })
	return p
}

// target returns a kubelet-shaped publish target path of pod uid, with its parent made as kubelet would.
func target(t testing.TB, uid, pv string) string {
	t.Helper()
	dir := filepath.Join(kubeletDir, "pods", uid, "volumes", "kubernetes.io~csi", pv)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(kubeletDir, "pods", uid)) })
	return filepath.Join(dir, "mount")
}
