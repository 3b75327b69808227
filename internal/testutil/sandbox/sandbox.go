// Package sandbox stands in for a microVM runtime handler in crust-csi-proxy's tests: it claims deferred
// volumes from crustd, "mounts them in the guest" (on the host, in a private directory; the tests need no
// VM), formatting a blank device first when the descriptor allows, and answers crustd's stats and online
// expansion from that mount, as a handler answers from inside its VM. Serve gives a test's own handler
// (one that answers from fixed numbers, say) the same socket and connection to crustd.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/handler"
)

// Sandbox is one sandbox: a RuntimeHandlerService on its own socket and the volumes it claimed.
type Sandbox struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer
	t        testing.TB
	id, dir  string
	rt       *handler.Client
	endpoint string
	mounter  *mount.SafeFormatAndMount
	resizer  *mount.ResizeFs

	mu     sync.Mutex
	mounts map[string]string // target path to guest path
	made   int               // guest directories made, for their names
}

// New serves a sandbox's handler and connects to crustd at crustSock; everything is undone at cleanup.
func New(t testing.TB, crustSock, id string) *Sandbox {
	t.Helper()
	dir, err := os.MkdirTemp("", "sandbox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &Sandbox{t: t, id: id, dir: dir, mounts: map[string]string{},
		mounter: mount.NewSafeFormatAndMount(mount.New(""), utilexec.New()), resizer: mount.NewResizeFs(utilexec.New())}
	s.rt, s.endpoint, _ = Serve(t, crustSock, filepath.Join(dir, "handler.sock"), s)
	t.Cleanup(func() { // before Serve's clean-up: releasing needs the connection
		s.mu.Lock()
		targets := make([]string, 0, len(s.mounts))
		for tp := range s.mounts {
			targets = append(targets, tp)
		}
		s.mu.Unlock()
		for _, tp := range targets {
			s.Stop(tp)
		}
	})
	return s
}

// Serve serves h as a sandbox's runtime handler on the unix socket sock and connects to crustd at
// crustSock. It returns the connection and h's endpoint, to claim volumes with (rt.Claim(ctx, target,
// sandboxID, endpoint)) and release them, and stop, which stops the handler for a test that wants it gone
// earlier. The handler stops (again, harmlessly) and the connection closes at cleanup.
func Serve(t testing.TB, crustSock, sock string, h crustv1.RuntimeHandlerServiceServer) (rt *handler.Client, endpoint string, stop func()) {
	t.Helper()
	stop, endpoint, err := handler.ServeHandler(sock, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	rt, err = handler.Dial(crustSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close() })
	return rt, endpoint, stop
}

// Start claims the volume at target, as the sandbox starting does, and mounts it; it returns the guest
// path. It fails the test when the claim or the mount fails.
func (s *Sandbox) Start(target string) string {
	s.t.Helper()
	guest, err := s.Claim(target)
	if err != nil {
		s.t.Fatal(err)
	}
	return guest
}

// Claim is Start for a goroutine other than the test's: it returns the error instead of failing the test.
func (s *Sandbox) Claim(target string) (string, error) {
	v, err := s.rt.Claim(context.Background(), target, s.id, s.endpoint)
	if err != nil {
		return "", fmt.Errorf("claim %s: %w", target, err)
	}
	spec := v.GetSpec()
	s.mu.Lock()
	guest := filepath.Join(s.dir, fmt.Sprintf("vol%d", s.made))
	s.made++
	s.mu.Unlock()
	if err := os.MkdirAll(guest, 0o755); err != nil {
		return "", err
	}
	opts := append([]string(nil), spec.GetMountFlags()...)
	if spec.GetReadOnly() {
		opts = append(opts, "ro")
	}
	if spec.GetCreateFilesystem() {
		err = s.mounter.FormatAndMount(v.GetResolvedBackingPath(), guest, spec.GetFsType(), opts)
	} else {
		err = s.mounter.Mount(v.GetResolvedBackingPath(), guest, spec.GetFsType(), opts)
	}
	if err != nil {
		return "", fmt.Errorf("guest mount of %s: %w", v.GetResolvedBackingPath(), err)
	}
	s.mu.Lock()
	s.mounts[target] = guest
	s.mu.Unlock()
	return guest, nil
}

// Stop unmounts the volume at target and releases the claim, as a sandbox going away does. A volume it
// does not hold is left alone.
func (s *Sandbox) Stop(target string) {
	s.mu.Lock()
	guest, ok := s.mounts[target]
	delete(s.mounts, target)
	s.mu.Unlock()
	if !ok {
		return
	}
	if err := mount.CleanupMountPoint(guest, s.mounter, true); err != nil {
		s.t.Errorf("guest unmount: %v", err)
	}
	_ = s.rt.Release(context.Background(), target, s.id)
}

func (s *Sandbox) guest(target string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.mounts[target]
	if !ok {
		return "", errors.New("not mounted in this sandbox")
	}
	return g, nil
}

// GetVolumeStats measures the guest mount of a claimed volume: bytes and inodes, as statfs says.
func (s *Sandbox) GetVolumeStats(_ context.Context, r *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	g, err := s.guest(r.GetVolumeTargetPath())
	if err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(g, &st); err != nil {
		return nil, err
	}
	bs := st.Bsize
	return &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Unit: crustv1.VolumeUsage_UNIT_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: crustv1.VolumeUsage_UNIT_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

// ExpandVolume grows the filesystem of a claimed volume online to fill its device and returns its size.
func (s *Sandbox) ExpandVolume(_ context.Context, r *crustv1.RuntimeHandlerServiceExpandVolumeRequest) (*crustv1.RuntimeHandlerServiceExpandVolumeResponse, error) {
	g, err := s.guest(r.GetVolumeTargetPath())
	if err != nil {
		return nil, err
	}
	dev, _, err := mount.GetDeviceNameFromMount(s.mounter, g)
	if err != nil {
		return nil, err
	}
	if _, err := s.resizer.Resize(dev, g); err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(g, &st); err != nil {
		return nil, err
	}
	return &crustv1.RuntimeHandlerServiceExpandVolumeResponse{CapacityBytes: int64(st.Blocks) * st.Bsize}, nil
}

// Holds reports whether the sandbox has the volume at target mounted.
func (s *Sandbox) Holds(target string) bool {
	_, err := s.guest(target)
	return err == nil
}
