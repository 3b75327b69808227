package daemon_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/daemon"
	"crust.dev/crust/internal/testutil/crustdtest"
	"crust.dev/crust/internal/testutil/harness"
)

// previousRelease is the last commit whose crustd wrote (and read) store record version 1 alone, the
// crustd of the v0.1.0 images: a rollback from this crustd returns to it. Its successor, 82b3b28, made
// the store write version 2, which this crustd reads but writes only when told to.
const previousRelease = "453814c9d801533d082f06bb823feed37c683fac"

// TestRollbackToPreviousRelease writes state with this crustd and then starts the previous release's
// crustd on it: it must start and hold every descriptor, as `kubectl rollout undo` needs.
//
// The previous crustd is built from its own source at previousRelease, taken out of this repository's
// history with git archive (CI runs on a full clone; a shallow one fails here, saying so) and built with
// its own go.mod. That is the real program an operator rolls back to, its start-up checks included,
// rather than a copy of its decoding rules that could drift from what it did. As a control, the same
// binary must refuse state written in record version 2 (--store-write-version=2), which shows that the
// test can fail; then this crustd, restarted with its defaults, rewrites that state for it.
//
// Building the previous crustd takes minutes on a cold cache, so -short (the unit tier) skips this.
func TestRollbackToPreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the previous release's crustd from git history")
	}
	prev := buildPreviousCrustd(t)

	root := t.TempDir()
	cfg, err := crustdtest.FileConfig(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := harness.Context(t, 10*time.Minute)
	defer cancel()

	// This crustd, told to write record version 2, stages a volume; the previous crustd refuses that.
	cfg.StoreWriteVersion = 2
	first := runCrustd(ctx, t, cfg, func(c *client.Client) {
		publishFile(ctx, t, c, cfg, root, "bbbbbbbb-0000-4000-8000-00000000000a", "pv-first")
	})
	out, err := exec.CommandContext(ctx, prev, previousFlags(cfg)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "newer version") {
		t.Fatalf("the previous crustd on record version 2: %v, want it to refuse a newer version:\n%s", err, out)
	}

	// This crustd with its defaults rewrites that record and stages another one.
	cfg.StoreWriteVersion = daemon.Defaults().StoreWriteVersion
	want := runCrustd(ctx, t, cfg, func(c *client.Client) {
		publishFile(ctx, t, c, cfg, root, "bbbbbbbb-0000-4000-8000-00000000000b", "pv-second")
	})
	if len(want) != len(first)+1 {
		t.Fatalf("this crustd holds %d descriptors after the second start, want %d", len(want), len(first)+1)
	}

	old := harness.StartProc(t, harness.ProcConfig{Bin: prev, Args: previousFlags(cfg), Ready: harness.Serving(cfg.Socket), StopMustSucceed: true})
	c, err := client.New(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	got := listVolumes(ctx, t, c)
	if len(got) != len(want) {
		t.Fatalf("the previous crustd holds %d descriptors, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i].GetSpec()
		if ws := w.GetSpec(); g.GetVolumeTargetPath() != ws.GetVolumeTargetPath() || g.GetVolumeId() != ws.GetVolumeId() ||
			g.GetVolumeBackingPath() != ws.GetVolumeBackingPath() || g.GetFsType() != ws.GetFsType() ||
			!got[i].GetStageTime().AsTime().Equal(w.GetStageTime().AsTime()) {
			t.Errorf("the previous crustd holds\n%v\nwhere this one held\n%v", got[i], w)
		}
	}
	if corrupt, err := os.ReadDir(filepath.Join(cfg.StateDir, "corrupt")); err != nil || len(corrupt) != 0 {
		t.Errorf("the previous crustd moved records aside: %v, %v", corrupt, err)
	}
	old.Stop()
}

// buildPreviousCrustd builds crustd at previousRelease into a temp directory and returns its path.
func buildPreviousCrustd(t *testing.T) string {
	t.Helper()
	repo, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse --show-toplevel: %v (the test needs the repository's history)", err)
	}
	if out, err := exec.Command("git", "-C", strings.TrimSpace(string(repo)), "cat-file", "-e", previousRelease+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s, the previous release, is not in this clone (a shallow clone? fetch its history): %v\n%s", previousRelease, err, out)
	}
	src := t.TempDir()
	archive := exec.Command("bash", "-c", `set -o pipefail; git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`,
		"archive", strings.TrimSpace(string(repo)), previousRelease, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", previousRelease, err, out)
	}
	bin := filepath.Join(t.TempDir(), "crustd-previous")
	build := exec.Command("go", "build", "-o", bin, "./cmd/crustd")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the previous crustd (%s): %v\n%s", previousRelease, err, out)
	}
	return bin
}

// runCrustd runs this crustd (in process) with cfg, calls do with a client of it, and returns the
// descriptors it then holds, having stopped it.
func runCrustd(ctx context.Context, t *testing.T, cfg daemon.Config, do func(*client.Client)) []*crustv1.Volume {
	t.Helper()
	stop, err := crustdtest.Start(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	do(c)
	held := listVolumes(ctx, t, c)
	_ = c.Close()
	if err := stop(); err != nil {
		t.Fatalf("crustd: %v", err)
	}
	return held
}

// listVolumes returns every descriptor c's crustd holds, in target path order.
func listVolumes(ctx context.Context, t *testing.T, c *client.Client) []*crustv1.Volume {
	t.Helper()
	var all []*crustv1.Volume
	req := &crustv1.ListVolumesRequest{}
	for {
		resp, err := c.Volumes().ListVolumes(ctx, req)
		if err != nil {
			t.Fatalf("ListVolumes: %v", err)
		}
		all = append(all, resp.GetVolumes()...)
		if resp.GetNextToken() == "" {
			return all
		}
		req.StartingToken = resp.GetNextToken()
	}
}

// previousFlags are the previous crustd's flags for what cfg (crustdtest.FileConfig) configures: the same
// socket, state, kubelet directory and image files, and no Kata directory, HTTP listener or CRI runtime.
func previousFlags(cfg daemon.Config) []string {
	args := []string{
		"--crust-socket", cfg.Socket, "--state-dir", cfg.StateDir, "--kata-dir", "", "--kubelet-dir", cfg.KubeletDir,
		"--http-addr", "", "--cri-endpoint", "", "--allow-file-backed",
	}
	for _, glob := range cfg.DeviceAllow {
		args = append(args, "--device-allow", glob)
	}
	for _, uid := range cfg.AllowUIDs {
		args = append(args, "--allow-uid", strconv.FormatUint(uint64(uid), 10))
	}
	return args
}
