package forward

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/kata/katatest"
	"crust.dev/crust/internal/katadir"
)

// kataVolume is a volume whose claim was read from a Kata sandbox-id file, as the manager makes it.
func kataVolume(device, sandbox string) *crustv1.Volume {
	return &crustv1.Volume{
		Spec: &crustv1.VolumeSpec{
			VolumeTargetPath:  "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount",
			VolumeBackingPath: device,
			FsType:            "ext4",
		},
		Claim: &crustv1.Claim{SandboxId: sandbox, Kata: true},
	}
}

func TestKataStats(t *testing.T) {
	const dev, sb = "/dev/disk/by-id/virtio-vol 1", "3f5a"
	for _, tc := range []struct {
		name      string
		runtimeRS bool
		postOnly  bool // the shim serves stats on POST only, as runtime-rs does
		answer    katatest.VolumeStats
		want      *crustv1.GetVolumeStatsResponse
	}{
		{
			name: "go runtime, record example",
			answer: katatest.VolumeStats{Usage: []katatest.VolumeUsage{
				{Available: 1032192, Total: 1064960, Used: 32768, Unit: 1},
				{Available: 65525, Total: 65536, Used: 11, Unit: 2},
			}},
			want: &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
				{Available: 1032192, Total: 1064960, Used: 32768, Unit: crustv1.VolumeUsage_UNIT_BYTES},
				{Available: 65525, Total: 65536, Used: 11, Unit: crustv1.VolumeUsage_UNIT_INODES},
			}},
		},
		{
			name: "runtime-rs place, omitted zeros and condition", runtimeRS: true,
			answer: katatest.VolumeStats{
				Usage:           []katatest.VolumeUsage{{Total: 4096, Unit: 1}, {Used: 5, Unit: 9}},
				VolumeCondition: &katatest.VolumeCondition{Abnormal: true, Message: "remounted read-only"},
			},
			want: &crustv1.GetVolumeStatsResponse{
				Usage: []*crustv1.VolumeUsage{
					{Total: 4096, Unit: crustv1.VolumeUsage_UNIT_BYTES},
					{Used: 5, Unit: crustv1.VolumeUsage_UNIT_UNSPECIFIED},
				},
				VolumeCondition: &crustv1.VolumeCondition{Abnormal: true, Message: "remounted read-only"},
			},
		},
		{
			name: "runtime-rs, stats by POST", runtimeRS: true, postOnly: true,
			answer: katatest.VolumeStats{Usage: []katatest.VolumeUsage{{Available: 7, Total: 9, Used: 2, Unit: 1}}},
			want: &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
				{Available: 7, Total: 9, Used: 2, Unit: crustv1.VolumeUsage_UNIT_BYTES},
			}},
		},
		{
			name:   "numbers past int64 are clamped",
			answer: katatest.VolumeStats{Usage: []katatest.VolumeUsage{{Total: math.MaxUint64, Available: 1 << 63, Used: 1, Unit: 1}}},
			want: &crustv1.GetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
				{Total: math.MaxInt64, Available: math.MaxInt64, Used: 1, Unit: crustv1.VolumeUsage_UNIT_BYTES},
			}},
		},
		{name: "empty answer", want: &crustv1.GetVolumeStatsResponse{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goDir, rsDir := katatest.ShimDirs(t)
			dir := goDir
			if tc.runtimeRS {
				dir = rsDir
			}
			shim := (&katatest.Shim{StatsPostOnly: tc.postOnly, Stats: func(device string) (*katatest.VolumeStats, error) {
				if device != dev {
					return nil, errors.New("unknown device " + device)
				}
				return &tc.answer, nil
			}}).Start(t, katatest.ShimSocket(dir, sb))
			f := &Forwarder{KataShimDirs: []string{goDir, rsDir}}
			got, err := f.Stats(context.Background(), kataVolume(dev, sb))
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Errorf("Stats = %v, want %v", got, tc.want)
			}
			reqs := shim.Requests()
			if len(reqs) == 0 || reqs[len(reqs)-1].RawQuery != "path=%2Fdev%2Fdisk%2Fby-id%2Fvirtio-vol%201" ||
				(tc.postOnly && reqs[len(reqs)-1].Method != "POST") {
				t.Errorf("shim got %+v", reqs)
			}
		})
	}
}

// TestKataDeviceIsTheProjections: the shim is asked about the device mountInfo.json names, the backing
// path as crustd resolved it at stage time, not the path as the CSI driver gave it.
func TestKataDeviceIsTheProjections(t *testing.T) {
	goDir, rsDir := katatest.ShimDirs(t)
	var asked []string
	(&katatest.Shim{
		Stats:  func(device string) (*katatest.VolumeStats, error) { asked = append(asked, device); return nil, nil },
		Resize: func(device string, _ uint64) error { asked = append(asked, device); return nil },
	}).Start(t, katatest.ShimSocket(goDir, "sb"))
	v := kataVolume("/dev/disk/by-id/virtio-vol1", "sb")
	v.ResolvedBackingPath = "/dev/vdc"
	f := &Forwarder{KataShimDirs: []string{goDir, rsDir}}
	if _, err := f.Stats(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Expand(context.Background(), v, 1<<30, 1<<30); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/dev/vdc", "/dev/vdc"}; !slices.Equal(asked, want) {
		t.Fatalf("the shim was asked about %q, want %q", asked, want)
	}
	if want, _ := json.Marshal(katadir.MountInfo(v)); !strings.Contains(string(want), `"device":"/dev/vdc"`) {
		t.Fatalf("the projection names another device: %s", want)
	}
}

func TestKataExpand(t *testing.T) {
	goDir, rsDir := katatest.ShimDirs(t)
	var resized []string
	shim := (&katatest.Shim{Resize: func(device string, size uint64) error {
		resized = append(resized, device)
		if size != 3<<30 {
			return errors.New("wrong size")
		}
		return nil
	}}).Start(t, katatest.ShimSocket(rsDir, "sb"))
	f := &Forwarder{KataShimDirs: []string{goDir, rsDir}}
	got, err := f.Expand(context.Background(), kataVolume("/dev/loop9", "sb"), 3<<30, 3<<30)
	if err != nil || got != 3<<30 {
		t.Fatalf("Expand = %d, %v; want %d", got, err, 3<<30)
	}
	if reqs := shim.Requests(); len(reqs) != 1 || string(reqs[0].Body) != `{"VolumePath":"/dev/loop9","Size":3221225472}` {
		t.Errorf("shim got %+v", reqs)
	}
	if _, err := f.Expand(context.Background(), kataVolume("/dev/loop9", "sb"), 0, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Expand to 0: %v", err)
	}
	if len(resized) != 1 {
		t.Errorf("resized %q", resized)
	}
}

// TestKataErrors: each failure has its kind, and the message carries the shim's text.
func TestKataErrors(t *testing.T) {
	type op int
	const (
		stats op = iota
		expand
	)
	for _, tc := range []struct {
		name     string
		noShim   bool
		shim     func() *katatest.Shim
		device   string
		op       op
		kind     error // nil: none of errdefs' kinds (INTERNAL)
		wantText string
	}{
		{name: "unreachable", noShim: true, device: "/dev/x", kind: errdefs.ErrUnavailable, wantText: "shim-monitor.sock"},
		{name: "unreachable expand", noShim: true, device: "/dev/x", op: expand, kind: errdefs.ErrUnavailable, wantText: "shim-monitor.sock"},
		{name: "400", device: "", kind: errdefs.ErrInvalidArgument, wantText: `query parameter "path" is required`},
		{name: "resize unimplemented (a real Kata today)", device: "/dev/x", op: expand, kind: errdefs.ErrUnimplemented, wantText: katatest.UnimplementedText},
		{
			name: "500 not implemented",
			shim: func() *katatest.Shim {
				return &katatest.Shim{Stats: func(string) (*katatest.VolumeStats, error) {
					return nil, errors.New("volume stats: Not Implemented for this hypervisor")
				}}
			},
			device: "/dev/x", kind: errdefs.ErrUnimplemented, wantText: "volume stats: Not Implemented for this hypervisor",
		},
		{
			name: "404 to GET and to POST",
			shim: func() *katatest.Shim {
				return &katatest.Shim{StatsPostOnly: true, Stats: func(string) (*katatest.VolumeStats, error) {
					return nil, errors.New("direct-volume stats: Not Implemented")
				}}
			},
			device: "/dev/x", kind: errdefs.ErrUnimplemented, wantText: "direct-volume stats: Not Implemented",
		},
		{
			name: "other 500",
			shim: func() *katatest.Shim {
				return &katatest.Shim{Resize: func(string, uint64) error { return errors.New("guest: resize2fs failed: no space") }}
			},
			device: "/dev/x", op: expand, wantText: "guest: resize2fs failed: no space",
		},
		{name: "unknown device", device: "/dev/none", wantText: "volume with device /dev/none is not in this sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goDir, rsDir := katatest.ShimDirs(t)
			if !tc.noShim {
				s := &katatest.Shim{}
				if tc.shim != nil {
					s = tc.shim()
				}
				s.Start(t, katatest.ShimSocket(goDir, "sb"))
			}
			f := &Forwarder{KataShimDirs: []string{goDir, rsDir}}
			v := kataVolume(tc.device, "sb")
			var err error
			if tc.op == expand {
				_, err = f.Expand(context.Background(), v, 1<<30, 1<<30)
			} else {
				_, err = f.Stats(context.Background(), v)
			}
			if err == nil {
				t.Fatal("no error")
			}
			kinds := []error{errdefs.ErrUnavailable, errdefs.ErrInvalidArgument, errdefs.ErrUnimplemented,
				errdefs.ErrFailedPrecondition, errdefs.ErrNotFound}
			for _, k := range kinds {
				if errors.Is(err, k) != (k == tc.kind) {
					t.Errorf("errors.Is(%v, %v) = %t", err, k, k != tc.kind)
				}
			}
			if !strings.Contains(err.Error(), tc.wantText) || !strings.Contains(err.Error(), v.GetSpec().GetVolumeTargetPath()) {
				t.Errorf("message %q lacks %q or the target", err, tc.wantText)
			}
		})
	}
}

// TestKataDefaultDirs: the zero Forwarder looks where Kata puts its sockets.
func TestKataDefaultDirs(t *testing.T) {
	var f Forwarder
	_, err := f.Stats(context.Background(), kataVolume("/dev/x", "crust-test-no-such-sandbox"))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "/run/vc/sbs/crust-test-no-such-sandbox/shim-monitor.sock") ||
		!strings.Contains(err.Error(), "/run/kata/crust-test-no-such-sandbox/shim-monitor.sock") {
		t.Fatalf("Stats: %v", err)
	}
	if !errors.Is(err, kata.ErrShimUnreachable) {
		t.Errorf("the shim client's error is not kept: %v", err)
	}
}
