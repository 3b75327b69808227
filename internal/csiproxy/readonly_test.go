package csiproxy

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/pkg/fsgroup"
)

// TestReadOnlyHostMountReplaysNothing: a read-only host mount of an ext4 or xfs whose journal needs
// recovery (the filesystem was shut down without flushing its log) mounts and leaves the device's bytes
// as they were; a plain read-only mount, the control, replays the journal and changes
// them. A read-only holder thus writes nothing under the others that share the device.
func TestReadOnlyHostMountReplaysNothing(t *testing.T) {
	for fsType, size := range map[string]int64{"ext4": 64 << 20, "xfs": 320 << 20} {
		t.Run(fsType, func(t *testing.T) {
			dev, _ := testutil.Loop(t, size)
			dirty(t, dev, fsType)
			sum := func() [32]byte {
				b, err := os.ReadFile(dev)
				if err != nil {
					t.Fatal(err)
				}
				return sha256.Sum256(b)
			}
			before := sum()
			p := &Proxy{mounter: mount.NewSafeFormatAndMount(mount.New(""), utilexec.New())}
			rec := &Record{Path: filepath.Join(t.TempDir(), "target"), Device: dev, FsType: fsType, ReadOnly: true}
			if err := os.Mkdir(rec.Path, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := p.hostMount(rec, []string{"noatime"}, nil, fsgroup.Always); err != nil {
				t.Fatal(err)
			}
			// What it shows is the filesystem as last made consistent: for xfs that is before the log
			// holding the synced file, for ext4 after it.
			if _, err := os.ReadDir(rec.Path); err != nil {
				t.Errorf("the read-only mount does not read: %v", err)
			}
			if err := p.hostUnmount(rec.Path); err != nil {
				t.Fatal(err)
			}
			if sum() != before {
				t.Fatal("a read-only host mount changed the device")
			}
			// The control: without the option, the same mount replays the journal.
			if out, err := exec.Command("mount", "-o", "ro", dev, rec.Path).CombinedOutput(); err != nil {
				t.Fatalf("mount -o ro: %v: %s", err, out)
			}
			if err := p.hostUnmount(rec.Path); err != nil {
				t.Fatal(err)
			}
			if sum() == before {
				t.Fatal("the control did not replay the journal: the device holds no journal to recover")
			}
		})
	}
}

// dirty makes a filesystem of fsType on dev whose journal needs recovery: a file synced, another
// written, and the filesystem shut down without flushing its log, then unmounted.
func dirty(t *testing.T, dev, fsType string) {
	t.Helper()
	mnt := t.TempDir()
	for _, argv := range [][]string{
		{"mkfs." + fsType, "-q", dev},
		{"mount", dev, mnt},
		{"sh", "-c", "echo -n synced > " + mnt + "/synced && sync && echo -n lost > " + mnt + "/lost"},
		{"xfs_io", "-x", "-c", "shutdown", mnt}, // ext4 takes xfs' shutdown ioctl too; without -f: no log flush
		{"umount", mnt},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", argv, err, out)
		}
	}
}
