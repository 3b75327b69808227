//go:build linux

package guest

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

func TestParseMountOptions(t *testing.T) {
	o := parseMountOptions("tmpfs", []string{"nosuid", "strictatime", "mode=755", "size=65536k", "ro", "rw", "rslave"})
	if o.flags != unix.MS_NOSUID|unix.MS_STRICTATIME || o.bind || strings.Join(o.data, ",") != "mode=755,size=65536k" ||
		o.propagation != unix.MS_SLAVE|unix.MS_REC {
		t.Errorf("tmpfs: %+v", o)
	}
	if o := parseMountOptions("", []string{"rbind", "ro"}); !o.bind || !o.recursive || o.flags != unix.MS_RDONLY {
		t.Errorf("rbind,ro: %+v", o)
	}
	if o := parseMountOptions("bind", nil); !o.bind || o.recursive {
		t.Errorf("type bind: %+v", o)
	}
}

func TestCheckCreate(t *testing.T) {
	ok := func() *agentv1.CreateContainerRequest {
		return &agentv1.CreateContainerRequest{ContainerId: "c1", Root: "/run/crust/shared/c1/rootfs",
			Mounts:  []*agentv1.ContainerMount{{Destination: "/data", Type: "bind", Source: "/run/crust/volumes/v"}},
			Devices: []*agentv1.ContainerDevice{{Path: "/dev/xvda", Source: "/run/crust/volumes/b"}}}
	}
	if err := checkCreate(ok()); err != nil {
		t.Fatal(err)
	}
	for field, spoil := range map[string]func(r *agentv1.CreateContainerRequest){
		"container_id":           func(r *agentv1.CreateContainerRequest) { r.ContainerId = "../x" },
		"root":                   func(r *agentv1.CreateContainerRequest) { r.Root = "rootfs" },
		"mounts[0].destination":  func(r *agentv1.CreateContainerRequest) { r.Mounts[0].Destination = "/data/../etc" },
		"mounts[0].type":         func(r *agentv1.CreateContainerRequest) { r.Mounts[0].Type = "overlay" },
		"mounts[0].source":       func(r *agentv1.CreateContainerRequest) { r.Mounts[0].Source = "relative" },
		"devices[0].path":        func(r *agentv1.CreateContainerRequest) { r.Devices[0].Path = "dev/xvda" },
		"devices[0].source":      func(r *agentv1.CreateContainerRequest) { r.Devices[0].Source = "" },
		"mounts[0].destination ": func(r *agentv1.CreateContainerRequest) { r.Mounts[0].Destination = "/" },
	} {
		r := ok()
		spoil(r)
		err := checkCreate(r)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("%s spoilt: %v, want INVALID_ARGUMENT naming it", field, err)
		}
	}
}

func TestCapsAndRlimits(t *testing.T) {
	for name, c := range map[string]int{"CAP_CHOWN": unix.CAP_CHOWN, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
		"CAP_AUDIT_READ": unix.CAP_AUDIT_READ, "CAP_CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE} {
		if capByName[name] != c {
			t.Errorf("%s is %d, want %d", name, capByName[name], c)
		}
	}
	if s := capSet([]string{"CAP_KILL", "CAP_NOT_ONE", "CAP_BPF"}); s != 1<<unix.CAP_KILL|1<<unix.CAP_BPF {
		t.Errorf("capSet = %#x", s)
	}
	if err := checkProcess(&agentv1.Process{Args: []string{"sh"}, Rlimits: []*agentv1.Rlimit{{Type: "RLIMIT_NOPE"}}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an unknown rlimit: %v", err)
	}
	if err := checkProcess(&agentv1.Process{Args: []string{"sh"}, Cwd: "tmp"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a relative cwd: %v", err)
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := lookPath("tool", []string{"A=1", "PATH=/nonexistent:" + dir}); err != nil || p != filepath.Join(dir, "tool") {
		t.Errorf("lookPath = %q, %v", p, err)
	}
	if _, err := lookPath("tool", []string{"PATH=/nonexistent"}); !errors.Is(err, errExecNotFound) {
		t.Errorf("missing: %v", err)
	}
	if p, _ := lookPath("./x/y", nil); p != "./x/y" {
		t.Errorf("a path with '/' was looked up: %q", p)
	}
}

// TestStream writes more than the buffer holds: the writer blocks until the reader takes data, and
// everything arrives in order, then end of file.
func TestStream(t *testing.T) {
	r, w := io.Pipe()
	s := newStream(r)
	want := make([]byte, 2*streamBuffer+123)
	for i := range want {
		want[i] = byte(i % 251)
	}
	go func() {
		_, _ = w.Write(want)
		_ = w.Close()
	}()
	var got []byte
	for {
		data, eof, err := s.read(context.Background(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		held := len(s.buf)
		s.mu.Unlock()
		if held > streamBuffer {
			t.Fatalf("the stream holds %d bytes, over its bound", held)
		}
		got = append(got, data...)
		if eof {
			break
		}
	}
	if string(got) != string(want) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(want))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r2, _ := io.Pipe()
	if _, _, err := newStream(r2).read(ctx, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("read with a cancelled context: %v", err)
	}
}
