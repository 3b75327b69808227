package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/safedir/safedirtest"
)

// TestPlantedLinks drives a real crustd: a symbolic link planted at a volume directory's place in the
// Kata directory makes StageVolume answer FAILED_PRECONDITION, writes nothing where it points (the
// descriptor carries a secret) and stores nothing; once the link is gone the same call succeeds.
func TestPlantedLinks(t *testing.T) {
	d := newDaemon(t)
	c := crustv1.NewVolumeServiceClient(d.conn())
	req := &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
		VolumeTargetPath: d.podTarget("planted", "pv"), VolumeBackingPath: loopDevice(t, 16<<20), FsType: "ext4",
		VolumeId: "v1", Metadata: map[string]string{"encryptionKey": "s3cret"},
	}}
	outside := t.TempDir()
	link := filepath.Join(d.kata, kata.VolumeDirName(req.GetSpec().GetVolumeTargetPath()))
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	before := safedirtest.Snapshot(t, outside)
	_, err := c.StageVolume(context.Background(), req)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), link) {
		t.Fatalf("stage over a planted link: %v; want FAILED_PRECONDITION naming %s", err, link)
	}
	safedirtest.Unchanged(t, before, outside)
	restageAfterRemoving(t, c, req, link, "the link is gone")
}

// TestUnsafeDirsStopCrustd: crustd refuses to start on a state or Kata directory that another user owns
// or may write in, or that is a symbolic link, naming the path, the owner and the mode; it creates
// nothing there.
func TestUnsafeDirsStopCrustd(t *testing.T) {
	for _, tc := range []struct {
		name, flag string
		mode       os.FileMode
		uid        int
		link       bool
		want       string
	}{
		{"state dir 0777", "--state-dir", 0o777, 0, false, "owned by uid 0 with mode 0777"},
		{"state dir of another user", "--state-dir", 0o700, 1000, false, "owned by uid 1000 with mode 0700"},
		{"state dir a link", "--state-dir", 0o700, 0, true, "symbolic link"},
		{"kata dir 0777", "--kata-dir", 0o777, 0, false, "owned by uid 0 with mode 0777"},
		{"kata dir of another user", "--kata-dir", 0o755, 1000, false, "owned by uid 1000 with mode 0755"},
		{"kata dir a link", "--kata-dir", 0o700, 0, true, "symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "dir")
			safedirtest.Mkdir(t, dir, tc.mode, tc.uid)
			given := dir
			if tc.link {
				given = filepath.Join(root, "link")
				if err := os.Symlink(dir, given); err != nil {
					t.Fatal(err)
				}
			}
			args := map[string]string{
				"--socket": filepath.Join(root, "crust.sock"), "--state-dir": filepath.Join(root, "state"),
				"--kata-dir": filepath.Join(root, "kata"), "--kubelet-dir": root, "--http-addr": "",
			}
			args[tc.flag] = given
			var argv []string
			for k, v := range args {
				argv = append(argv, k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a crustd that starts serves on
			defer cancel()
			out, err := exec.CommandContext(ctx, filepath.Join(binDir, "crustd"), argv...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), given) || !strings.Contains(string(out), tc.want) {
				t.Fatalf("crustd %s %s: %v\n%s\nwant a refusal naming %s and %q", tc.flag, given, err, out, given, tc.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("crustd created %v in %s", entries, dir)
			}
		})
	}
}
