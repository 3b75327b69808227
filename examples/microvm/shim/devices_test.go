package shim

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"crust.dev/crust/api/errdefs"
)

func TestDeviceReadOnly(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	dev := specs.LinuxDevice{Type: "b", Major: 7, Minor: 3}
	for _, c := range []struct {
		name  string
		rules []specs.LinuxDeviceCgroup
		want  bool
	}{
		{"no rules", nil, false},
		{"deny all, allow rwm", []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Type: "b", Major: n(7), Minor: n(3), Access: "rwm"}}, false},
		{"deny all, allow r", []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Type: "b", Major: n(7), Minor: n(3), Access: "r"}}, true},
		{"allow r of another device", []specs.LinuxDeviceCgroup{{Allow: true, Type: "b", Major: n(7), Minor: n(4), Access: "r"}}, false},
		{"a char rule", []specs.LinuxDeviceCgroup{{Allow: true, Type: "c", Major: n(7), Minor: n(3), Access: "r"}}, false},
		{"allow rw, then deny w", []specs.LinuxDeviceCgroup{{Allow: true, Type: "b", Access: "rw"}, {Allow: false, Type: "b", Major: n(7), Access: "w"}}, true},
	} {
		spec := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{Devices: c.rules}}}
		if got := deviceReadOnly(spec, dev); got != c.want {
			t.Errorf("%s: read-only %t, want %t", c.name, got, c.want)
		}
	}
}

// TestMakeBlockNode makes a node (root only), accepts the same node again, and refuses another device, a
// link or a file in its place.
func TestMakeBlockNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "devices", "dev-7-3")
	for range 2 {
		if err := makeBlockNode(p, 7, 3); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node %v, %v; want a block device of mode 0600", fi.Mode(), err)
	}
	if err := makeBlockNode(p, 7, 4); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("another device at the node: %v, want failed precondition", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if err := makeBlockNode(link, 7, 3); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a link to the node: %v, want failed precondition (not followed)", err)
	}
}
