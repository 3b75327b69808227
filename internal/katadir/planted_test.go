package katadir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
)

// TestPlantedLinkIsFailedPrecondition: a link planted at a volume directory's place is a failed
// precondition for every call of the projection (never an internal error), and the descriptor, secret
// metadata included, is not written where it points.
func TestPlantedLinkIsFailedPrecondition(t *testing.T) {
	p, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(p.Dir(), kata.VolumeDirName(target))); err != nil {
		t.Fatal(err)
	}
	v := volume(func(s *crustv1.VolumeSpec) { s.Metadata = map[string]string{"encryptionKey": "s3cret"} })
	for name, op := range map[string]func() error{
		"Write":         func() error { return p.Write(v) },
		"SandboxIDs":    func() error { _, _, err := p.SandboxIDs(target); return err },
		"ForgetSandbox": func() error { return p.ForgetSandbox(target, "sb") },
		"Sync": func() error {
			failed, err := p.Sync([]*crustv1.Volume{v}, nil)
			return errors.Join(err, failed[v.GetSpec().GetVolumeTargetPath()])
		},
	} {
		if err := op(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s = %v; want FAILED_PRECONDITION", name, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("written through the link: %v", entries)
	}
}

// TestNewRefusesAnUnsafeDir: a Kata directory another user owns or may write in, or a link at its place,
// stops crustd at start with FAILED_PRECONDITION.
func TestNewRefusesAnUnsafeDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	loose := filepath.Join(t.TempDir(), "loose")
	theirs := filepath.Join(t.TempDir(), "theirs")
	link := filepath.Join(t.TempDir(), "link")
	for _, d := range []string{loose, theirs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(theirs, link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{loose, theirs, link} {
		if _, err := New(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("New(%s) = %v; want FAILED_PRECONDITION", dir, err)
		}
	}
}
