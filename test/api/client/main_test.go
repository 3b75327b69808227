package client_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"crust.dev/crust/internal/testutil/crustdtest"
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
	cfg, err := crustdtest.FileConfig(root)
	if err != nil {
		panic(err)
	}
	socket, kubeletDir, imageDir = cfg.Socket, cfg.KubeletDir, filepath.Join(root, crustdtest.ImageDir)
	stop, err := crustdtest.Start(cfg, nil)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = stop() }()
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
