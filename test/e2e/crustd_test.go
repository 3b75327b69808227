package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/internal/testutil/harness"
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

// TestMetricsAndHealth checks the HTTP endpoint: readiness, RPCs counted by service, method and code,
// the volumes by state, and stats answered from the host.
func TestMetricsAndHealth(t *testing.T) {
	addr := freeAddr(t)
	d := newDaemon(t, "--http-addr", addr)
	if _, _, code := d.crustctl("get", d.podTarget("p", "nope")); code != 1 {
		t.Fatal("get of an unknown volume succeeded")
	}
	// One volume staged and asked for stats: no sandbox claims it, so crustd answers from the host.
	target := d.podTarget("p", "pv")
	d.crustctlOK("stage", "--target-path", target, "--device", loopDevice(t, 16<<20), "--fs-type", "xfs")
	d.crustctlOK("stats", target)
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := harness.HTTPGet(t, addr, p); code != 200 {
			t.Fatalf("%s: %d %s", p, code, body)
		}
	}
	_, body := harness.HTTPGet(t, addr, "/metrics")
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="NotFound",grpc_method="GetVolume",grpc_service="crust.v1.VolumeService",grpc_type="unary"} 1`,
		`crust_volumes{state="staged"} 1`,
		`crust_volumes{state="claimed"} 0`,
		`crust_stats_from_host_total{volume_mode="filesystem"} 1`,
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
		{"claim", target, "--sandbox-id", "sb-1"},
		{"release", target, "--sandbox-id", "sb-1"},
		{"unstage", "--target-path", target},
	} {
		d.crustctlOK(args...)
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
			small := tmpfsDir(t, "crust-full", "256k")
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
			restageAfterRemoving(t, c, req, filler, "space returned")
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

// tmpfsDir mounts a new tmpfs named source, of size (mount's size= option) and mode 0700, on a new
// directory, and returns the directory; the tmpfs is unmounted at cleanup.
func tmpfsDir(t *testing.T, source, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), source)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", source, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs of %s: %v: %s", size, err, out)
	}
	// Lazily: a descriptor this process still holds there (a store the test opened, which keeps its
	// directories open) must not keep the mount, and so the temporary directory, in place.
	t.Cleanup(func() { _ = exec.Command("umount", "--lazy", dir).Run() })
	return dir
}

// restageAfterRemoving is the end of a test of a refused StageVolume of req: it checks that crustd
// (through c) stored no descriptor, removes path (what made crustd refuse the call) and makes the same
// call again, which must succeed; once says what changed, for the failure message.
func restageAfterRemoving(t *testing.T, c crustv1.VolumeServiceClient, req *crustv1.StageVolumeRequest, path, once string) {
	t.Helper()
	if l, err := c.ListVolumes(context.Background(), &crustv1.ListVolumesRequest{}); err != nil || len(l.GetVolumes()) != 0 {
		t.Fatalf("a refused stage stored %v, %v", l.GetVolumes(), err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StageVolume(context.Background(), req); err != nil {
		t.Fatalf("stage once %s: %v", once, err)
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

// TestVersionAgrees builds the binaries with a version stamped as the Makefile stamps it, and checks that
// every --version, `crustctl version` and crustd's crust_build_info report the same build.
func TestVersionAgrees(t *testing.T) {
	const stamped = "v9.8.7-e2e"
	dir := t.TempDir()
	build := exec.Command("go", "build", "-ldflags", "-X crust.dev/crust/api/version.version="+stamped, "-o", dir+"/",
		"crust.dev/crust/cmd/...", "crust.dev/crust/examples/microvm/cmd/...",
		"crust.dev/crust/examples/lvm-csi/cmd/crust-lvm-csi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	line := regexp.MustCompile(`^(\S+) version (\S+) \(revision (\S+), (go\S+)\)\n`)
	var revision, goVersion string
	for _, c := range [][]string{
		{"crustd", "--version"}, {"crust-csi-proxy", "--version"}, {"crustctl", "--version"}, {"crustctl", "version"},
		{"crust-microvm", "--version"}, {"crust-lvm-csi", "--version"}, {"crust-guest", "--version"},
	} {
		out, errOut, code := runAs(t, nil, filepath.Join(dir, c[0]), c[1:]...)
		m := line.FindStringSubmatch(out)
		if code != 0 || m == nil || m[1] != c[0] || m[2] != stamped {
			t.Fatalf("%v: exit %d, printed %q (stderr %q); want %q version %s (revision …)", c, code, out, errOut, c[0], stamped)
		}
		if revision == "" {
			revision, goVersion = m[3], m[4]
		} else if m[3] != revision || m[4] != goVersion {
			t.Errorf("%v: revision %s %s, another binary said %s %s", c, m[3], m[4], revision, goVersion)
		}
	}
	// crustctl version, with no crustd to ask, says where crustd's version is to be found.
	if out, _, _ := runAs(t, nil, filepath.Join(dir, "crustctl"), "--crust-socket", filepath.Join(dir, "none.sock"), "version"); !strings.Contains(out, "crust_build_info") {
		t.Errorf("crustctl version: %q does not say where crustd's version is", out)
	}

	addr := freeAddr(t)
	d := harness.StartCrustd(t, filepath.Join(dir, "crustd"), "--kata-dir", "", "--http-addr", addr)
	_, body := harness.HTTPGet(t, addr, "/metrics")
	want := fmt.Sprintf(`crust_build_info{goversion=%q,revision=%q,version=%q} 1`, goVersion, revision, stamped)
	if !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s", want)
	}
	// crustctl version asks crustd (GetInfo) for its own.
	out, errOut, code := runAs(t, nil, filepath.Join(dir, "crustctl"), "--crust-socket", d.Socket, "version")
	if want := fmt.Sprintf("crustd version %s (revision %s, API crust.v1)\n", stamped, revision); code != 0 || !strings.HasSuffix(out, want) {
		t.Errorf("crustctl version: exit %d, printed %q (stderr %q); want it to end with %q", code, out, errOut, want)
	}
}

// TestSocketSpellings: --crust-socket, its old name --socket and CRUST_SOCKET all name crustd's socket,
// for crustd and for crustctl.
func TestSocketSpellings(t *testing.T) {
	d := newDaemon(t)
	// crustd itself still takes the old name (and says it is old): start it again with it.
	d.Stop()
	d.Args = slices.Clone(d.Args)
	d.Args[slices.Index(d.Args, "--crust-socket")] = "--socket"
	d.start()
	ctl := filepath.Join(binDir, "crustctl")
	for _, c := range []struct {
		name string
		env  []string
		args []string
	}{
		{"flag", nil, []string{"--crust-socket", d.socket, "ls"}},
		{"old flag", nil, []string{"--socket=" + d.socket, "ls"}},
		{"environment", []string{"CRUST_SOCKET=" + d.socket}, []string{"ls"}},
		{"flag beats environment", []string{"CRUST_SOCKET=/nonexistent.sock"}, []string{"--crust-socket", d.socket, "ls"}},
	} {
		cmd := exec.Command(ctl, c.args...)
		cmd.Env = append(os.Environ(), c.env...)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "TARGET") {
			t.Errorf("%s: %v: %s", c.name, err, out)
		}
	}
	if !strings.Contains(d.Log(), "--socket is an old name of --crust-socket") {
		t.Errorf("crustd did not warn of --socket:\n%s", d.Log())
	}
}

// TestDialErrorsSayWhatToCheck: a missing socket names crustd, the path and how to name another; a
// socket this user may not reach names root and --allow-uid.
func TestDialErrorsSayWhatToCheck(t *testing.T) {
	ctl := filepath.Join(binDir, "crustctl")
	missing := filepath.Join(t.TempDir(), "none.sock")
	_, errOut, code := runAs(t, nil, ctl, "--crust-socket", missing, "--timeout", "5s", "ls")
	if code != 1 || !strings.Contains(errOut, "Unavailable") || !strings.Contains(errOut, "no crustd is serving at "+missing) ||
		!strings.Contains(errOut, "--crust-socket or CRUST_SOCKET") {
		t.Errorf("missing socket: exit %d: %s", code, errOut)
	}

	d := newDaemon(t) // its socket is mode 0600, under directories of mode 0700
	if err := os.Chmod(filepath.Dir(d.root), 0o755); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runAs(t, &syscall.Credential{Uid: 1000, Gid: 1000}, ctl, "--crust-socket", d.socket, "--timeout", "5s", "ls")
	if code != 1 || !strings.Contains(errOut, "permission denied") || !strings.Contains(errOut, "run as root") ||
		!strings.Contains(errOut, "--allow-uid/--allow-gid admit uid 1000") {
		t.Errorf("socket out of reach: exit %d: %s", code, errOut)
	}
}

// TestWatchTable: `crustctl watch -o table` prints a header and a row an event, as they happen.
func TestWatchTable(t *testing.T) {
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	watch := exec.CommandContext(ctx, filepath.Join(binDir, "crustctl"), "--crust-socket", d.socket, "watch", "--existing", "-o", "table")
	out, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = watch.Wait() }()
	lines := bufio.NewScanner(out)
	next := func() []string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("watch ended: %v", lines.Err())
		}
		return strings.Fields(lines.Text())
	}
	if h := next(); strings.Join(h, " ") != "REVISION EVENT TARGET SANDBOX DETAIL" {
		t.Fatalf("header %q", h)
	}
	if r := next(); len(r) < 2 || r[1] != "synced" {
		t.Fatalf("first row %q, want synced", r)
	}
	target := d.podTarget("pod-wt", "pv")
	d.crustctlOK("stage", "--target-path", target, "--device", loopDevice(t, 16<<20), "--fs-type", "xfs")
	if r := next(); len(r) < 4 || r[1] != "staged" || r[2] != target || r[3] != "-" {
		t.Fatalf("row %q, want staged %s", r, target)
	}
	if _, errOut, code := d.crustctl("claim", target, "--sandbox-id", "sb-t"); code != 0 {
		t.Fatalf("claim: %s", errOut)
	}
	if r := next(); len(r) < 4 || r[1] != "claimed" || r[3] != "sb-t" {
		t.Fatalf("row %q, want claimed by sb-t", r)
	}
	// A bad -o is refused before the stream starts.
	if _, errOut, code := d.crustctl("watch", "-o", "xml"); code != 2 || !strings.Contains(errOut, `-o: "xml"`) {
		t.Errorf("watch -o xml: exit %d: %s", code, errOut)
	}
}
