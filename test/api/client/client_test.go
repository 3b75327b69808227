package client_test

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"crust.dev/crust/api/client"
	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/sandbox"
)

func mountCap(fs string, flags []string, group string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType: fs, MountFlags: flags, VolumeMountGroup: group,
		}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func publishReq(targetPath string, vc *csi.VolumeCapability, ctx map[string]string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: "vol-1", TargetPath: targetPath, VolumeCapability: vc, VolumeContext: ctx}
}

func TestStageRequest(t *testing.T) {
	gid := int64(2000)
	for _, tc := range []struct {
		name string
		req  *csi.NodePublishVolumeRequest
		opts []client.PublishOption
		want *crustv1.VolumeSpec
	}{{
		name: "everything from the request",
		req: &csi.NodePublishVolumeRequest{
			VolumeId: "vol-1", TargetPath: "/k/pods/u/volumes/kubernetes.io~csi/pv/mount", Readonly: true,
			VolumeCapability: mountCap("xfs", []string{"noatime,nodiscard", " noatime ", "", "rw"}, "2000"),
			VolumeContext: map[string]string{
				volume.DeferKey: "true", volume.PodUIDKey: "u", volume.PodNameKey: "p", volume.PodNamespaceKey: "ns",
				volume.ServiceAccountKey: "sa", volume.EphemeralKey: "true",
				"csi.storage.k8s.io/serviceAccount.tokens": "secret", "other": "x",
			},
		},
		want: &crustv1.VolumeSpec{
			VolumeTargetPath: "/k/pods/u/volumes/kubernetes.io~csi/pv/mount", VolumeBackingPath: "/dev/vg/lv",
			VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK, FsType: "xfs",
			MountFlags: []string{"noatime", "nodiscard", "rw"}, ReadOnly: true, VolumeSupplementalGroup: &gid,
			VolumeId: "vol-1", PodUid: "u",
			Metadata: map[string]string{
				volume.PodUIDKey: "u", volume.PodNameKey: "p", volume.PodNamespaceKey: "ns",
				volume.ServiceAccountKey: "sa", volume.EphemeralKey: "true",
			},
		},
	}, {
		name: "defaults, a ro flag, options",
		req:  publishReq("/t", mountCap("", []string{"ro", "rw"}, "2000"), nil),
		opts: []client.PublishOption{
			client.DefaultFSType("btrfs"), client.CreateFilesystem(), client.DriverName("d.example.com"),
			client.FSGroupChangePolicy(crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH),
			client.Metadata(map[string]string{"encryptionKey": "k"}),
			client.VolumeType(crustv1.VolumeType_VOLUME_TYPE_PMEM),
		},
		want: &crustv1.VolumeSpec{
			VolumeTargetPath: "/t", VolumeBackingPath: "/dev/vg/lv", VolumeType: crustv1.VolumeType_VOLUME_TYPE_PMEM,
			FsType: "btrfs", MountFlags: []string{"rw"}, ReadOnly: true, VolumeSupplementalGroup: &gid,
			SupplementalGroupChangePolicy: crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ON_ROOT_MISMATCH,
			CreateFilesystem:              true, VolumeId: "vol-1", CsiDriver: "d.example.com",
			Metadata: map[string]string{"encryptionKey": "k"},
		},
	}, {
		name: "no fs type anywhere, no group so no policy",
		req:  publishReq("/t", mountCap("", nil, ""), nil),
		opts: []client.PublishOption{client.FSGroupChangePolicy(crustv1.FSGroupChangePolicy_FS_GROUP_CHANGE_POLICY_ALWAYS)},
		want: &crustv1.VolumeSpec{
			VolumeTargetPath: "/t", VolumeBackingPath: "/dev/vg/lv", VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK,
			FsType: volume.DefaultFSType, VolumeId: "vol-1",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := client.StageRequest(tc.req, "/dev/vg/lv", tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got.GetSpec(), tc.want) {
				t.Errorf("got  %v\nwant %v", got.GetSpec(), tc.want)
			}
		})
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// TestStageRequestRawBlock: a block capability with RawBlock makes a raw block spec, filesystem options
// notwithstanding; RawBlock does nothing to a mount capability.
func TestStageRequestRawBlock(t *testing.T) {
	req := publishReq("/t", blockCap(), map[string]string{volume.PodUIDKey: "u", volume.PodNameKey: "p"})
	req.Readonly = true
	got, err := client.StageRequest(req, "/dev/vg/lv", client.CreateFilesystem(), client.DefaultFSType("xfs"),
		client.RawBlock(), client.DriverName("d.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	want := &crustv1.VolumeSpec{
		VolumeTargetPath: "/t", VolumeBackingPath: "/dev/vg/lv", VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK,
		VolumeMode: crustv1.VolumeMode_VOLUME_MODE_BLOCK, ReadOnly: true, VolumeId: "vol-1", PodUid: "u",
		CsiDriver: "d.example.com", Metadata: map[string]string{volume.PodUIDKey: "u", volume.PodNameKey: "p"},
	}
	if !proto.Equal(got.GetSpec(), want) {
		t.Errorf("got  %v\nwant %v", got.GetSpec(), want)
	}
	got, err = client.StageRequest(publishReq("/t", mountCap("", nil, ""), nil), "/dev/x", client.RawBlock())
	if err != nil || got.GetSpec().GetVolumeMode() != crustv1.VolumeMode_VOLUME_MODE_UNSPECIFIED || got.GetSpec().GetFsType() != volume.DefaultFSType {
		t.Fatalf("RawBlock on a mount capability: %v, %v", got, err)
	}
}

func TestStageRequestRefusals(t *testing.T) {
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	for _, tc := range []struct {
		name, device, field string
		req                 *csi.NodePublishVolumeRequest
	}{
		{"nil request", "/dev/x", "volume_id", nil},
		{"no volume id", "/dev/x", "volume_id", &csi.NodePublishVolumeRequest{TargetPath: "/t", VolumeCapability: mountCap("", nil, "")}},
		{"no target", "/dev/x", "target_path", &csi.NodePublishVolumeRequest{VolumeId: "v", VolumeCapability: mountCap("", nil, "")}},
		{"no capability", "/dev/x", "volume_capability", publishReq("/t", nil, nil)},
		{"block without RawBlock", "/dev/x", "volume_capability", publishReq("/t", block, nil)},
		{"neither mount nor block", "/dev/x", "volume_capability", publishReq("/t", &csi.VolumeCapability{}, nil)},
		{"bad group", "/dev/x", "volume_mount_group", publishReq("/t", mountCap("", nil, "wheel"), nil)},
		{"no device", "", "device", publishReq("/t", mountCap("", nil, ""), nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.StageRequest(tc.req, tc.device)
			s := status.Convert(err)
			if s.Code() != codes.InvalidArgument || !contains(s.Message(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestDeferredAndPodInfo(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "True": true, " 1 ": true, "false": false, "yes": false, "": false} {
		if got := volume.Deferred(map[string]string{volume.DeferKey: v}); got != want {
			t.Errorf("Deferred(%q) = %v, want %v", v, got, want)
		}
	}
	if volume.Deferred(nil) {
		t.Error("Deferred(nil) is true")
	}
	p := client.PodInfo(map[string]string{volume.PodNameKey: "p", volume.EphemeralKey: "false"})
	if p != (client.Pod{Name: "p"}) {
		t.Errorf("PodInfo = %+v", p)
	}
	if md := p.Metadata(); !reflect.DeepEqual(md, map[string]string{volume.PodNameKey: "p"}) {
		t.Errorf("Metadata = %v", md)
	}
	if md := (client.Pod{}).Metadata(); md != nil {
		t.Errorf("empty Metadata = %v", md)
	}
}

func newClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(socket, client.WithDriverName("lvm.test.crust.dev"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var fileType = client.VolumeType(crustv1.VolumeType_VOLUME_TYPE_FILE)

// Publish deposits, a repeat is a success, other parameters are AlreadyExists, Unpublish removes and is
// idempotent; crustd's refusals keep their codes.
func TestPublishUnpublish(t *testing.T) {
	c, ctx := newClient(t), ctxT(t)
	const uid = "aaaaaaaa-0000-4000-8000-000000000001"
	tp := target(t, uid, "pv-a")
	dev := image(t, "a.img")
	req := publishReq(tp, mountCap("ext4", []string{"noatime"}, "3000"), map[string]string{volume.DeferKey: "true", volume.PodUIDKey: uid})

	if held, err := c.Holds(ctx, tp); err != nil || held {
		t.Fatalf("Holds before = %v, %v", held, err)
	}
	if _, err := c.Publish(ctx, req, dev, fileType); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, req, dev, fileType); err != nil {
		t.Fatalf("repeat: %v", err)
	}
	v, err := c.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: tp})
	if err != nil {
		t.Fatal(err)
	}
	if s := v.GetVolume().GetSpec(); s.GetCsiDriver() != "lvm.test.crust.dev" || s.GetPodUid() != uid ||
		s.GetVolumeSupplementalGroup() != 3000 || s.GetVolumeId() != "vol-1" {
		t.Errorf("stored spec %v", s)
	}
	if held, err := c.Holds(ctx, tp); err != nil || !held {
		t.Fatalf("Holds after publish = %v, %v", held, err)
	}
	// Calls naming another volume never act on this one's path.
	if _, err := c.Unpublish(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-2", TargetPath: tp}); status.Code(err) != codes.NotFound {
		t.Fatalf("unpublish of another volume's target: %v, want NotFound", err)
	}
	if _, err := c.Stats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-2", VolumePath: tp}); status.Code(err) != codes.NotFound {
		t.Fatalf("stats of another volume's target: %v, want NotFound", err)
	}
	if _, err := c.Expand(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-2", VolumePath: tp,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}}); status.Code(err) != codes.NotFound {
		t.Fatalf("expand of another volume's target: %v, want NotFound", err)
	}
	if held, err := c.Holds(ctx, tp); err != nil || !held {
		t.Fatalf("Holds after calls for another volume = %v, %v", held, err)
	}
	other := proto.Clone(req).(*csi.NodePublishVolumeRequest)
	other.Readonly = true
	if _, err := c.Publish(ctx, other, dev, fileType); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("publish with other parameters: %v, want AlreadyExists", err)
	}
	bad := publishReq(target(t, "aaaaaaaa-0000-4000-8000-000000000002", "pv-b"), mountCap("vfat", nil, ""), nil)
	if _, err := c.Publish(ctx, bad, dev, fileType); status.Code(err) != codes.InvalidArgument || !contains(status.Convert(err).Message(), "fs_type") {
		t.Fatalf("vfat: %v, want InvalidArgument naming fs_type", err)
	}
	outside := publishReq("/elsewhere/mount", mountCap("", nil, ""), nil)
	if _, err := c.Publish(ctx, outside, dev, fileType); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("target outside the kubelet dir: %v, want InvalidArgument", err)
	}

	// A raw block publish, when the driver asks for it, is stored in block mode.
	rawTarget := target(t, "aaaaaaaa-0000-4000-8000-000000000003", "pv-raw")
	if _, err := c.Publish(ctx, publishReq(rawTarget, blockCap(), nil), image(t, "raw.img"), fileType, client.RawBlock()); err != nil {
		t.Fatalf("raw block publish: %v", err)
	}
	if v, err := c.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: rawTarget}); err != nil ||
		v.GetVolume().GetSpec().GetVolumeMode() != crustv1.VolumeMode_VOLUME_MODE_BLOCK || v.GetVolume().GetSpec().GetFsType() != "" ||
		len(v.GetVolume().GetKataCaveats()) != 1 {
		t.Fatalf("raw block descriptor: %v, %v", v, err)
	}
	// Stage is Publish that answers with the volume held, its caveats with it (here a repeat).
	if v, err := c.Stage(ctx, publishReq(rawTarget, blockCap(), nil), image(t, "raw.img"), fileType, client.RawBlock()); err != nil ||
		v.GetSpec().GetVolumeTargetPath() != rawTarget || len(v.GetKataCaveats()) != 1 {
		t.Fatalf("Stage of the raw block volume again = %v, %v; want it with its caveat", v, err)
	}
	if _, err := c.Unpublish(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: rawTarget}); err != nil {
		t.Fatal(err)
	}

	ureq := &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: tp}
	for i := 0; i < 2; i++ {
		if _, err := c.Unpublish(ctx, ureq); err != nil {
			t.Fatalf("unpublish %d: %v", i, err)
		}
	}
	if held, err := c.Holds(ctx, tp); err != nil || held {
		t.Fatalf("Holds after unpublish = %v, %v", held, err)
	}
	for _, p := range []string{"", "relative/path", "/elsewhere"} {
		if held, err := c.Holds(ctx, p); err != nil || held {
			t.Errorf("Holds(%q) = %v, %v; want false, nil", p, held, err)
		}
	}
	if _, err := c.Unpublish(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: tp}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unpublish without volume id: %v", err)
	}
}

// fixedHandler is a runtime handler that answers from fixed numbers.
type fixedHandler struct {
	crustv1.UnimplementedRuntimeHandlerServiceServer
	abnormal bool
	capacity int64
}

func (h *fixedHandler) GetVolumeStats(context.Context, *crustv1.RuntimeHandlerServiceGetVolumeStatsRequest) (*crustv1.RuntimeHandlerServiceGetVolumeStatsResponse, error) {
	r := &crustv1.RuntimeHandlerServiceGetVolumeStatsResponse{Usage: []*crustv1.VolumeUsage{
		{Available: 70, Total: 100, Used: 30, Unit: crustv1.VolumeUsage_UNIT_BYTES},
		{Available: 9, Total: 10, Used: 1, Unit: crustv1.VolumeUsage_UNIT_INODES},
	}}
	if h.abnormal {
		r.VolumeCondition = &crustv1.VolumeCondition{Abnormal: true, Message: "remounted read-only"}
	}
	return r, nil
}

func (h *fixedHandler) ExpandVolume(_ context.Context, r *crustv1.RuntimeHandlerServiceExpandVolumeRequest) (*crustv1.RuntimeHandlerServiceExpandVolumeResponse, error) {
	if r.GetRequiredBytes() > 48<<20 {
		return nil, status.Error(codes.OutOfRange, "the sandbox refuses")
	}
	h.capacity = max(h.capacity, r.GetRequiredBytes())
	return &crustv1.RuntimeHandlerServiceExpandVolumeResponse{CapacityBytes: h.capacity}, nil
}

// Stats, Health and Expand reach the runtime handler that claimed the volume, and their answers and
// errors come back in CSI's shapes and codes.
func TestStatsHealthExpandForwarded(t *testing.T) {
	c, ctx := newClient(t), ctxT(t)
	const uid = "bbbbbbbb-0000-4000-8000-000000000001"
	tp := target(t, uid, "pv-s")
	if _, err := c.Publish(ctx, publishReq(tp, mountCap("xfs", nil, ""), nil), image(t, "s.img"), fileType); err != nil {
		t.Fatal(err)
	}
	sreq := &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: tp}
	ereq := &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: tp, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}}
	// Before a claim: the device's size, usage unknown; expansion is recorded and answers the device's size.
	if st, err := c.Stats(ctx, sreq); err != nil || !proto.Equal(st, &csi.NodeGetVolumeStatsResponse{
		Usage: []*csi.VolumeUsage{{Total: 64 << 20, Unit: csi.VolumeUsage_BYTES}}}) {
		t.Fatalf("stats before a claim: %v, %v; want the image's 64 MiB, usage unknown", st, err)
	}
	if hr, err := c.Health(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-1", VolumePublishPath: tp}); err != nil ||
		len(hr.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("health before a claim: %v, %v; want no adverse condition", hr, err)
	}
	if er, err := c.Expand(ctx, ereq); err != nil || er.GetCapacityBytes() != 64<<20 {
		t.Fatalf("expand before a claim: %v, %v; want the image's 64 MiB", er, err)
	}
	if v, err := c.Volumes().GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: tp}); err != nil ||
		v.GetVolume().GetRequestedBytes() != 32<<20 {
		t.Fatalf("requested_bytes after expand before a claim: %v, %v; want %d", v, err, 32<<20)
	}

	h := &fixedHandler{capacity: 16 << 20}
	rt, endpoint, stop := sandbox.Serve(t, socket, filepath.Join(t.TempDir(), "h.sock"), h)
	if _, err := rt.Claim(ctx, tp, "sandbox-1", endpoint); err != nil {
		t.Fatal(err)
	}

	st, err := c.Stats(ctx, sreq)
	if err != nil {
		t.Fatal(err)
	}
	want := &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Available: 70, Total: 100, Used: 30, Unit: csi.VolumeUsage_BYTES},
		{Available: 9, Total: 10, Used: 1, Unit: csi.VolumeUsage_INODES},
	}}
	if !proto.Equal(st, want) {
		t.Errorf("stats %v, want %v", st, want)
	}
	hreq := &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-1", VolumePublishPath: tp}
	if hr, err := c.Health(ctx, hreq); err != nil || len(hr.GetVolumeHealth().GetHealthStatuses()) != 0 || hr.GetVolumeHealth().GetVolumeId() != "vol-1" {
		t.Errorf("health when normal: %v, %v", hr, err)
	}
	h.abnormal = true
	hr, err := c.Health(ctx, hreq)
	if err != nil {
		t.Fatal(err)
	}
	if e := hr.GetVolumeHealth().GetHealthStatuses(); len(e) != 1 || e[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED ||
		e[0].GetReason() != client.HealthReason || e[0].GetMessage() != "remounted read-only" {
		t.Errorf("health when abnormal: %v", hr)
	}

	er, err := c.Expand(ctx, ereq)
	if err != nil || er.GetCapacityBytes() != 32<<20 {
		t.Fatalf("expand: %v, %v", er, err)
	}
	big := proto.Clone(ereq).(*csi.NodeExpandVolumeRequest)
	big.CapacityRange.RequiredBytes = 60 << 20 // within the 64 MiB image, past what the handler accepts
	if _, err := c.Expand(ctx, big); status.Code(err) != codes.OutOfRange {
		t.Errorf("handler's refusal: %v, want its OutOfRange", err)
	}
	noSize := proto.Clone(ereq).(*csi.NodeExpandVolumeRequest)
	noSize.CapacityRange = nil
	if _, err := c.Expand(ctx, noSize); status.Code(err) != codes.InvalidArgument {
		t.Errorf("expand without a size: %v, want InvalidArgument", err)
	}

	stop()
	if _, err := c.Stats(ctx, sreq); status.Code(err) != codes.Unavailable {
		t.Errorf("stats with the handler gone: %v, want Unavailable", err)
	}
	if _, err := c.Stats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: tp + "x"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of a path crustd does not hold: %v, want NotFound", err)
	}
	if _, err := c.Stats(ctx, &csi.NodeGetVolumeStatsRequest{VolumePath: tp}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stats without volume id: %v, want InvalidArgument", err)
	}
	if _, err := c.Unpublish(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: tp}); err != nil {
		t.Fatal(err)
	}
	// The claim outlives the unpublish until its handler lets it go; crustd outlives this test.
	if err := rt.Release(ctx, tp, "sandbox-1"); err != nil {
		t.Fatal(err)
	}
}

// Stats, Health and Expand of a volume crustd does not hold at the path named answer NotFound, as CSI
// says for a volume that does not exist at that path, whatever the path looks like (csi-sanity sends
// the relative "some/path", which crustd refuses as a target).
func TestUnknownVolumeIsNotFound(t *testing.T) {
	c, ctx := newClient(t), ctxT(t)
	for _, p := range []string{"some/path", target(t, "cccccccc-0000-4000-8000-000000000001", "pv-none"), "/elsewhere/mount"} {
		if _, err := c.Stats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-x", VolumePath: p}); status.Code(err) != codes.NotFound {
			t.Errorf("stats at %q: %v, want NotFound", p, err)
		}
		if _, err := c.Expand(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-x", VolumePath: p,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}}); status.Code(err) != codes.NotFound {
			t.Errorf("expand at %q: %v, want NotFound", p, err)
		}
		if _, err := c.Health(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-x", VolumePublishPath: p}); status.Code(err) != codes.NotFound {
			t.Errorf("health at %q: %v, want NotFound", p, err)
		}
	}
}

// A client made before crustd answers waits within each call's context, and a call on a dead socket
// fails with Unavailable, a code CSI drivers return as it is.
func TestUnavailable(t *testing.T) {
	c, err := client.New(filepath.Join(t.TempDir(), "none.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Holds(ctx, "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pv/mount"); status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
}

// What the CSI proxy used to add to a descriptor after the fact is StageRequest's own: a reader-only
// access mode makes it read-only, and a target path of kubelet's shape gives the pod UID when the volume
// context does not (and does not override one it gives).
func TestStageRequestReadOnlyAndPodUID(t *testing.T) {
	const target = "/var/lib/kubelet/pods/0e0e0e0e-0000-4000-8000-00000000000b/volumes/kubernetes.io~csi/pv-1/mount"
	for _, mode := range []csi.VolumeCapability_AccessMode_Mode{
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	} {
		vc := mountCap("xfs", nil, "")
		vc.AccessMode.Mode = mode
		req, err := client.StageRequest(publishReq(target, vc, nil), "/dev/x")
		if err != nil || !req.GetSpec().GetReadOnly() || !client.ReadOnly(publishReq(target, vc, nil)) {
			t.Errorf("%v: %v, read_only %v; want read-only", mode, err, req.GetSpec().GetReadOnly())
		}
		if got := req.GetSpec().GetPodUid(); got != "0e0e0e0e-0000-4000-8000-00000000000b" {
			t.Errorf("pod_uid %q, want the target path's", got)
		}
	}
	req, err := client.StageRequest(publishReq(target, mountCap("", nil, ""), map[string]string{volume.PodUIDKey: "u-1"}), "/dev/x")
	if err != nil || req.GetSpec().GetPodUid() != "u-1" || req.GetSpec().GetReadOnly() {
		t.Errorf("%v, pod_uid %q, read_only %v; want the context's pod UID, read-write", err, req.GetSpec().GetPodUid(), req.GetSpec().GetReadOnly())
	}
	if req, err := client.StageRequest(publishReq("/mnt/x", mountCap("", nil, ""), nil), "/dev/x"); err != nil || req.GetSpec().GetPodUid() != "" {
		t.Errorf("%v, pod_uid %q for a path of no kubelet shape", err, req.GetSpec().GetPodUid())
	}
}
