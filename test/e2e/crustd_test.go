package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/pkg/api/crust/v1"
	"crust.dev/crust/pkg/kata"
	"crust.dev/crust/test/harness"
)

// TestLoopDeviceThroughCrustctl stages a real loop device with crustctl over the real socket, sees it in
// `ls -o json` and in the Kata directory exactly as Kata would read it, and unstages it.
func TestLoopDeviceThroughCrustctl(t *testing.T) {
	d := newDaemon(t)
	dev := loopDevice(t, 64<<20)
	target := d.podTarget("6f1c2d3e-0000-4000-8000-000000000001", "pvc-loop")

	out, errOut, code := d.crustctl("stage", "--target-path", target, "--device", dev, "--fs-type", "ext4",
		"--mount-option", "noatime", "--fs-group", "2000", "--read-only", "--volume-id", "vol-1")
	if code != 0 {
		t.Fatalf("stage: exit %d: %s", code, errOut)
	}
	var staged crustv1.Volume
	if err := protojson.Unmarshal([]byte(out), &staged); err != nil {
		t.Fatalf("stage output is not a Volume: %v\n%s", err, out)
	}

	out, errOut, code = d.crustctl("ls", "-o", "json")
	if code != 0 {
		t.Fatalf("ls: exit %d: %s", code, errOut)
	}
	var list crustv1.ListVolumesResponse
	if err := protojson.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, out)
	}
	if len(list.GetVolumes()) != 1 || !proto.Equal(list.GetVolumes()[0], &staged) {
		t.Fatalf("ls shows %v, want the staged volume %v", list.GetVolumes(), &staged)
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if dn := staged.GetDeviceNumber(); dn.GetMajor() != unix.Major(st.Rdev) || dn.GetMinor() != unix.Minor(st.Rdev) {
		t.Fatalf("recorded device number %v does not match %s (%d:%d)", dn, dev, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}

	// The Kata projection: one directory named by the target path, holding exactly mountInfo.json.
	dir := filepath.Join(d.kata, kata.VolumeDirName(target))
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 || entries[0].Name() != kata.MountInfoFileName {
		t.Fatalf("Kata volume dir %s holds %v (%v), want only %s", dir, entries, err, kata.MountInfoFileName)
	}
	mi, err := kata.Get(d.kata, target)
	if err != nil {
		t.Fatal(err)
	}
	want := &kata.MountInfo{VolumeType: "directvol", Device: dev, FsType: "ext4",
		Metadata: map[string]string{"fsGroup": "2000", "fsGroupChangePolicy": "Always"}, Options: []string{"noatime", "ro"}}
	if fmt.Sprint(mi) != fmt.Sprint(want) {
		t.Fatalf("Kata reads %+v, want %+v", mi, want)
	}
	// And crustctl direct-volume reads the same file offline.
	out, errOut, code = d.crustctl("direct-volume", "get", "--kata-dir", d.kata, "--volume-path", target, "-o", "json")
	if code != 0 || !strings.Contains(out, `"device": "`+dev+`"`) && !strings.Contains(out, `"device":"`+dev+`"`) {
		t.Fatalf("direct-volume get: exit %d: %s%s", code, out, errOut)
	}

	// Errors carry the gRPC code and the field.
	_, errOut, code = d.crustctl("stage", "--target-path", target, "--device", dev, "--fs-type", "vfat")
	if code != 1 || !strings.Contains(errOut, "InvalidArgument") || !strings.Contains(errOut, "fs_type") {
		t.Fatalf("bad fs type: exit %d: %s", code, errOut)
	}
	_, errOut, code = d.crustctl("stage", "--target-path", target, "--device", dev, "--fs-type", "xfs")
	if code != 1 || !strings.Contains(errOut, "AlreadyExists") {
		t.Fatalf("conflicting stage: exit %d: %s", code, errOut)
	}
	// Before any sandbox claims it, stats come from the device: its size, usage unknown, and why.
	out, errOut, code = d.crustctl("stats", target)
	if code != 0 || !strings.Contains(out, strconv.Itoa(64<<20)) || !strings.Contains(out, "not yet mounted in a sandbox") {
		t.Fatalf("stats of an unclaimed volume: exit %d: %s%s", code, out, errOut)
	}

	if _, errOut, code = d.crustctl("unstage", "--target-path", target); code != 0 {
		t.Fatalf("unstage: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Kata volume dir still there after unstage: %v", err)
	}
	_, errOut, code = d.crustctl("get", target)
	if code != 1 || !strings.Contains(errOut, "NotFound") {
		t.Fatalf("get after unstage: exit %d: %s", code, errOut)
	}
	if _, errOut, code = d.crustctl("unstage", "--target-path", target); code != 0 {
		t.Fatalf("second unstage must succeed: exit %d: %s", code, errOut)
	}
}

// TestPeerCredentials checks the socket is created 0600 and that, even when an operator widens it, a
// caller whose uid is not allowed is refused with PermissionDenied, while an allowed one gets through.
func TestPeerCredentials(t *testing.T) {
	d := newDaemon(t)
	fi, err := os.Stat(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Fatalf("socket mode %o, want 600", perm)
	}
	widen := func() {
		for _, p := range []string{filepath.Dir(d.root), d.root, filepath.Dir(d.socket)} {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(d.socket, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	widen()
	other := &syscall.Credential{Uid: 1000, Gid: 1000}
	ctl := filepath.Join(binDir, "crustctl")
	_, errOut, code := runAs(t, other, ctl, "--socket", d.socket, "ls")
	if code != 1 || !strings.Contains(errOut, "PermissionDenied") || !strings.Contains(errOut, "uid 1000") {
		t.Fatalf("uid 1000 not on the allow-list: exit %d: %s", code, errOut)
	}
	if _, errOut, code = d.crustctl("ls"); code != 0 {
		t.Fatalf("root: exit %d: %s", code, errOut)
	}

	d.Stop()
	d.Args = append(d.Args, "--allow-uid", "0", "--allow-uid", "1000")
	d.start()
	widen()
	if _, errOut, code = runAs(t, other, ctl, "--socket", d.socket, "ls"); code != 0 {
		t.Fatalf("uid 1000 on the allow-list: exit %d: %s", code, errOut)
	}
}

// TestKillAtAnyInstant stages and unstages volumes in a loop while crustd is killed with SIGKILL at a
// random instant, many times. After each restart every acknowledged change is there, the one change that
// may have been in flight is wholly old or wholly new, and the Kata projection equals the store.
func TestKillAtAnyInstant(t *testing.T) {
	d := newDaemon(t)
	dev := loopDevice(t, 16<<20)
	const targets = 8
	paths := make([]string, targets)
	for i := range paths {
		paths[i] = d.podTarget(fmt.Sprintf("pod-%d", i), "pv")
	}
	// staged[i]: what the store must say about target i, as far as acknowledged.
	staged := make([]bool, targets)
	rng := rand.New(rand.NewPCG(1, 2))
	rounds := 0
	deadline := time.Now().Add(12 * time.Second)
	for ; time.Now().Before(deadline) || rounds < 5; rounds++ {
		c := crustv1.NewVolumeServiceClient(d.conn())
		killAt := time.Duration(rng.IntN(40_000)) * time.Microsecond
		killed := make(chan struct{})
		go func() { time.Sleep(killAt); d.Kill(); close(killed) }() // the kill's instant is what is under test
		inflight := -1
		for op := 0; ; op++ {
			i := rng.IntN(targets)
			inflight = i
			var err error
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if staged[i] {
				_, err = c.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: paths[i]})
			} else {
				_, err = c.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
					VolumeTargetPath: paths[i], VolumeBackingPath: dev, FsType: "ext4", VolumeId: fmt.Sprint(i)}})
			}
			cancel()
			if err != nil {
				break // the daemon is gone; this op may or may not have landed
			}
			staged[i] = !staged[i]
			inflight = -1
		}
		<-killed
		d.start()
		list, err := crustv1.NewVolumeServiceClient(d.conn()).ListVolumes(context.Background(), &crustv1.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := make([]bool, targets)
		for _, v := range list.GetVolumes() {
			for i, p := range paths {
				if v.GetSpec().GetVolumeTargetPath() == p {
					got[i] = true
				}
			}
		}
		for i := range targets {
			if got[i] != staged[i] && i != inflight {
				t.Fatalf("round %d: target %d staged=%t, acknowledged %t\n%s", rounds, i, got[i], staged[i], d.Log())
			}
			staged[i] = got[i] // the in-flight op settles either way
		}
		checkProjection(t, d.kata, list.GetVolumes())
	}
	t.Logf("%d kill/restart rounds", rounds)
}

// checkProjection asserts the Kata dir holds exactly one directory per volume, each with exactly a
// mountInfo.json that names the volume's device, and nothing else but the temp dir.
func checkProjection(t *testing.T, kataDir string, vols []*crustv1.Volume) {
	t.Helper()
	want := map[string]*crustv1.Volume{}
	for _, v := range vols {
		want[kata.VolumeDirName(v.GetSpec().GetVolumeTargetPath())] = v
	}
	entries, err := os.ReadDir(kataDir)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // the temp dir, which Kata never reads
		}
		v, ok := want[e.Name()]
		if !ok {
			t.Fatalf("Kata dir holds %s, which no volume in the store has", e.Name())
		}
		files, _ := os.ReadDir(filepath.Join(kataDir, e.Name()))
		if len(files) != 1 || files[0].Name() != kata.MountInfoFileName {
			t.Fatalf("volume dir %s holds %v, want only %s", e.Name(), files, kata.MountInfoFileName)
		}
		mi, err := kata.Get(kataDir, v.GetSpec().GetVolumeTargetPath())
		if err != nil || mi.Device != v.GetSpec().GetVolumeBackingPath() || mi.FsType != v.GetSpec().GetFsType() {
			t.Fatalf("projection of %s: %+v, %v", v.GetSpec().GetVolumeTargetPath(), mi, err)
		}
		seen++
	}
	if seen != len(vols) {
		t.Fatalf("%d volume dirs for %d volumes", seen, len(vols))
	}
}

// TestMetricsAndHealth checks the HTTP endpoint: readiness, and RPCs counted by method and code.
func TestMetricsAndHealth(t *testing.T) {
	addr := freeAddr(t)
	d := newDaemon(t, "--http-addr", addr)
	if _, _, code := d.crustctl("get", d.podTarget("p", "nope")); code != 1 {
		t.Fatal("get of an unknown volume succeeded")
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := harness.HTTPGet(t, addr, p); code != 200 {
			t.Fatalf("%s: %d %s", p, code, body)
		}
	}
	_, body := harness.HTTPGet(t, addr, "/metrics")
	for _, want := range []string{
		`crust_rpc_requests_total{code="NotFound",method="/crust.v1.VolumeService/GetVolume"} 1`,
		`crust_volumes{state="staged"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}

// freeAddr returns a loopback TCP address free a moment ago, for --http-addr.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// TestWatchOverTheSocket follows one volume through stage, claim, release and unstage with crustctl as
// the acting client and a WatchVolumes stream as the observer.
func TestWatchOverTheSocket(t *testing.T) {
	d := newDaemon(t)
	dev := loopDevice(t, 16<<20)
	target := d.podTarget("pod-w", "pv")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := crustv1.NewRuntimeServiceClient(d.conn()).WatchVolumes(ctx, &crustv1.WatchVolumesRequest{SendExisting: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err != nil || ev.GetType() != crustv1.EventType_EVENT_TYPE_SYNCED {
		t.Fatalf("first event %v, %v; want SYNCED", ev, err)
	}
	for _, args := range [][]string{
		{"stage", "--target-path", target, "--device", dev, "--fs-type", "xfs"},
		{"claim", target, "--sandbox-id", "sb-1", "--endpoint", "unix:///run/handler.sock"},
		{"release", target, "--sandbox-id", "sb-1"},
		{"unstage", "--target-path", target},
	} {
		if _, errOut, code := d.crustctl(args...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
	}
	for _, want := range []crustv1.EventType{
		crustv1.EventType_EVENT_TYPE_STAGED, crustv1.EventType_EVENT_TYPE_CLAIMED,
		crustv1.EventType_EVENT_TYPE_RELEASED, crustv1.EventType_EVENT_TYPE_UNSTAGED,
	} {
		ev, err := stream.Recv()
		if err != nil || ev.GetType() != want || ev.GetVolume().GetSpec().GetVolumeTargetPath() != target {
			t.Fatalf("event %v, %v; want %v for %s", ev, err, want, target)
		}
	}
	// A bad request over the wire: the code is InvalidArgument and the message names the field.
	_, err = crustv1.NewRuntimeServiceClient(d.conn()).ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: "relative/path", SandboxId: "x"})
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "volume_target_path") {
		t.Fatalf("relative target: %v", err)
	}
	// An oversized request is refused before it is decoded, and changes nothing.
	_, err = crustv1.NewVolumeServiceClient(d.conn()).StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
		VolumeTargetPath: target, VolumeBackingPath: dev, FsType: "ext4",
		Metadata: map[string]string{"encryptionKey": strings.Repeat("k", 300<<10)}}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 300 KiB request: %v, want ResourceExhausted", err)
	}
	if _, errOut, code := d.crustctl("get", target); code != 1 || !strings.Contains(errOut, "NotFound") {
		t.Fatalf("the oversized request left something: exit %d %s", code, errOut)
	}
}

// A second crustd on a state directory in use exits at once, naming the first, and the first serves on.
func TestSecondDaemonOnOneStateDir(t *testing.T) {
	d := newDaemon(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // without the lock it would serve on
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "crustd"), "--socket", filepath.Join(d.root, "second.sock"),
		"--state-dir", d.state, "--kata-dir", "", "--kubelet-dir", d.kubelet, "--http-addr", "").CombinedOutput()
	if err == nil {
		t.Fatalf("a second crustd ran on %s:\n%s", d.state, out)
	}
	if want := fmt.Sprintf("held by pid %d (crustd)", d.Pid()); !strings.Contains(string(out), want) {
		t.Errorf("the second crustd did not name the holder (%q):\n%s", want, out)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the second crustd took %s to give up", took)
	}
	if err := d.serving(5 * time.Second); err != nil {
		t.Fatalf("the first crustd stopped serving: %v", err)
	}
}

// A full disk under crust's state or under the Kata projection answers RESOURCE_EXHAUSTED and leaves
// nothing half-written; the same call succeeds once space returns.
func TestFullDisk(t *testing.T) {
	for _, which := range []string{"--state-dir", "--kata-dir"} {
		t.Run(strings.TrimPrefix(which, "--"), func(t *testing.T) {
			small := filepath.Join(t.TempDir(), "small")
			if err := os.Mkdir(small, 0o700); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "crust-full", small).CombinedOutput(); err != nil {
				t.Fatalf("mount a small tmpfs: %v: %s", err, out)
			}
			t.Cleanup(func() { _ = exec.Command("umount", small).Run() })
			d := newDaemon(t, which, small)
			dev := loopDevice(t, 16<<20)
			c := crustv1.NewVolumeServiceClient(d.conn())
			req := &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
				VolumeTargetPath: d.podTarget("full", "pv"), VolumeBackingPath: dev, FsType: "ext4", VolumeId: "v1"}}
			// Fill the filesystem.
			filler := filepath.Join(small, "filler")
			f, err := os.Create(filler)
			if err != nil {
				t.Fatal(err)
			}
			for buf := make([]byte, 4096); ; {
				if _, err := f.Write(buf); err != nil {
					break
				}
			}
			_ = f.Close()
			before := treeOf(t, small)
			_, err = c.StageVolume(context.Background(), req)
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("stage on a full disk: %v; want RESOURCE_EXHAUSTED", err)
			}
			if after := treeOf(t, small); !slices.Equal(before, after) {
				t.Errorf("a refused stage changed the full filesystem: %v, then %v", before, after)
			}
			if l, err := c.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{}); err != nil || len(l.GetVolumes()) != 0 {
				t.Fatalf("after a refused stage: %v, %v", l.GetVolumes(), err)
			}
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			if _, err := c.StageVolume(context.Background(), req); err != nil {
				t.Fatalf("stage once space returned: %v", err)
			}
			if l, err := c.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{}); err != nil || len(l.GetVolumes()) != 1 {
				t.Fatalf("after space returned: %v, %v", l.GetVolumes(), err)
			}
			if _, err := c.UnstageVolume(context.Background(), &crustv1.UnstageVolumeRequest{VolumeTargetPath: req.GetSpec().GetVolumeTargetPath()}); err != nil {
				t.Fatal(err)
			}
			d.Stop()
		})
	}
}

// treeOf lists the files under dir with their sizes, the filler and the Kata projection's own
// (empty) temporary directory excluded; a file in that directory is listed.
func treeOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.Name() == "filler" || e.Name() == ".crust-tmp" {
			return err
		}
		if e.IsDir() {
			out = append(out, strings.TrimPrefix(p, dir)+"/")
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%s %d", strings.TrimPrefix(p, dir), fi.Size()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
