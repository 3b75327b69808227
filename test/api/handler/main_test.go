package handler_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/crustdtest"
)

// The examples run against a real crustd, in this process (a test may import the daemon; the package
// itself never does). Volumes are image files (VOLUME_TYPE_FILE), so that no root is needed.
var (
	socket string // crustd's socket
	root   string // the directory everything is under
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	var err error
	if root, err = os.MkdirTemp("", "crust-handler"); err != nil {
		panic(err)
	}
	defer func() { _ = os.RemoveAll(root) }()
	cfg, err := crustdtest.FileConfig(root)
	if err != nil {
		panic(err)
	}
	socket = cfg.Socket
	stop, err := crustdtest.Start(cfg, nil)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = stop() }()
	return m.Run()
}

// deposit does what a CSI driver does at NodePublishVolume for a deferred volume (see api/client): a
// 64 MiB image file stands in for the device. It returns the target path and a client of the driver's.
func deposit(pv string) (string, *client.Client, error) { return depositAt(root, socket, pv) }

// depositAt is deposit for the crustd serving at socket, of crustdtest.FileConfig(root).
func depositAt(root, socket, pv string) (string, *client.Client, error) {
	const podUID = "0f1e2d3c-0000-4000-8000-000000000001"
	device := filepath.Join(root, crustdtest.ImageDir, pv+".img")
	dir := filepath.Join(root, "kubelet", "pods", podUID, "volumes", "kubernetes.io~csi", pv)
	if err := os.MkdirAll(filepath.Join(dir, "mount"), 0o750); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(device, nil, 0o600); err != nil {
		return "", nil, err
	}
	if err := os.Truncate(device, 64<<20); err != nil {
		return "", nil, err
	}
	c, err := client.New(socket, client.WithDriverName("example.csi"))
	if err != nil {
		return "", nil, err
	}
	target := filepath.Join(dir, "mount")
	_, err = c.Volumes().StageVolume(context.Background(), &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
		VolumeTargetPath: target, VolumeBackingPath: device, VolumeType: crustv1.VolumeType_VOLUME_TYPE_FILE,
		FsType: "ext4", VolumeId: pv, CsiDriver: "example.csi", PodUid: podUID,
	}})
	return target, c, err
}
