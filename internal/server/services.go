package server

import (
	"context"
	"encoding/base64"
	"slices"

	"crust.dev/crust/api/volume"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/version"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/metrics"
	"crust.dev/crust/internal/peercred"
)

// Secret metadata (volume.IsSecretKey, such as encryptionKey) leaves crustd in one answer only: the
// ClaimVolume answer, to the handler that attaches the volume and needs the key. StageVolume, GetVolume,
// ListVolumes and WatchVolumes answer it as volume.Redacted: the key is there, its value is not; and
// they carry what the annotators add (see Config.Annotators).

// answers returns how a volume leaves crustd in an answer other than ClaimVolume's: annotated by each of
// annotators, then redacted. The volume given is never changed.
func answers(annotators []Annotator) func(*crustv1.Volume) *crustv1.Volume {
	return func(v *crustv1.Volume) *crustv1.Volume {
		for _, a := range annotators {
			v = a.Annotate(v)
		}
		return volume.RedactVolume(v)
	}
}

// event returns ev, or a copy of it whose volume is as out makes it. Events are shared by every watcher,
// so ev itself is never changed.
func event(ev *crustv1.WatchVolumesResponse, out func(*crustv1.Volume) *crustv1.Volume) *crustv1.WatchVolumesResponse {
	v := out(ev.GetVolume())
	if v == ev.GetVolume() {
		return ev
	}
	c := proto.CloneOf(ev)
	c.Volume = v
	return c
}

// volumes serves VolumeService for CSI node plugins.
type volumes struct {
	crustv1.UnimplementedVolumeServiceServer
	m       *manager.Manager
	out     func(*crustv1.Volume) *crustv1.Volume // see answers
	metrics *metrics.Metrics                      // nil: not counted
}

func (s *volumes) StageVolume(ctx context.Context, r *crustv1.StageVolumeRequest) (*crustv1.StageVolumeResponse, error) {
	v, err := s.m.Stage(ctx, r.GetSpec())
	if err != nil {
		return nil, err
	}
	return &crustv1.StageVolumeResponse{Volume: s.out(v)}, nil
}

func (s *volumes) UnstageVolume(ctx context.Context, r *crustv1.UnstageVolumeRequest) (*crustv1.UnstageVolumeResponse, error) {
	kept, err := s.m.Unstage(ctx, r.GetVolumeTargetPath())
	if err != nil {
		return nil, err
	}
	return &crustv1.UnstageVolumeResponse{KeptClaim: kept}, nil
}

func (s *volumes) GetVolume(ctx context.Context, r *crustv1.GetVolumeRequest) (*crustv1.GetVolumeResponse, error) {
	v, err := s.m.Get(ctx, r.GetVolumeTargetPath())
	if err != nil {
		return nil, err
	}
	return &crustv1.GetVolumeResponse{Volume: s.out(v)}, nil
}

// Paging of ListVolumes: a page holds at most listPageEntries descriptors (or max_entries, when smaller)
// and ends before listPageBytes, well inside gRPC's default 4 MiB message limit.
const (
	listPageEntries = 5000
	listPageBytes   = 3 << 20
)

func (s *volumes) ListVolumes(ctx context.Context, r *crustv1.ListVolumesRequest) (*crustv1.ListVolumesResponse, error) {
	if r.GetMaxEntries() < 0 {
		return nil, errdefs.Field("max_entries", "is %d; it must not be negative", r.GetMaxEntries())
	}
	after := ""
	if t := r.GetStartingToken(); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		if err != nil || len(b) == 0 || b[0] != '/' {
			return nil, errdefs.Field("starting_token", "%q is not a token crustd issued", t)
		}
		after = string(b)
	}
	n := listPageEntries
	if m := int(r.GetMaxEntries()); m > 0 && m < n {
		n = m
	}
	vols, more := s.m.ListPage(ctx, after, n, listPageBytes)
	for i, v := range vols {
		vols[i] = s.out(v)
	}
	resp := &crustv1.ListVolumesResponse{Volumes: vols}
	if more && len(vols) > 0 {
		// The token is the last target path of the page: the next page starts after it.
		resp.NextToken = base64.RawURLEncoding.EncodeToString([]byte(vols[len(vols)-1].GetSpec().GetVolumeTargetPath()))
	}
	return resp, nil
}

func (s *volumes) GetVolumeStats(ctx context.Context, r *crustv1.GetVolumeStatsRequest) (*crustv1.GetVolumeStatsResponse, error) {
	resp, err := s.m.Stats(ctx, r.GetVolumeTargetPath())
	if err != nil {
		return nil, err
	}
	if s.metrics != nil {
		switch resp.GetVolumeCondition().GetMessage() { // the answers Stats gives from the host
		case manager.NotMountedMessage:
			s.metrics.StatsFromHost("filesystem")
		case manager.NotAttachedRawMessage:
			s.metrics.StatsFromHost("block")
		}
	}
	return resp, nil
}

func (s *volumes) ExpandVolume(ctx context.Context, r *crustv1.ExpandVolumeRequest) (*crustv1.ExpandVolumeResponse, error) {
	capacity, err := s.m.Expand(ctx, r.GetVolumeTargetPath(), r.GetRequiredBytes(), r.GetLimitBytes())
	if err != nil {
		return nil, err
	}
	return &crustv1.ExpandVolumeResponse{CapacityBytes: capacity}, nil
}

// Bounds of a ListProblems answer, well inside gRPC's default 4 MiB message limit.
const (
	problemsMax   = 1000
	problemsBytes = 3 << 20
)

func (s *volumes) ListProblems(ctx context.Context, _ *crustv1.ListProblemsRequest) (*crustv1.ListProblemsResponse, error) {
	all := s.m.Problems(ctx)
	resp := &crustv1.ListProblemsResponse{}
	size := 0
	for i, p := range all {
		size += proto.Size(p)
		if i == problemsMax || size > problemsBytes {
			resp.Omitted = int32(len(all) - i) //nolint:gosec // len(all) is far below 2^31
			break
		}
		resp.Problems = append(resp.Problems, p)
	}
	return resp, nil
}

func (s *volumes) HoldForNode(ctx context.Context, r *crustv1.HoldForNodeRequest) (*crustv1.HoldForNodeResponse, error) {
	h, err := s.m.HoldForNode(ctx, r.GetHold())
	if err != nil {
		return nil, err
	}
	return &crustv1.HoldForNodeResponse{Hold: h}, nil
}

func (s *volumes) ReleaseFromNode(ctx context.Context, r *crustv1.ReleaseFromNodeRequest) (*crustv1.ReleaseFromNodeResponse, error) {
	if err := s.m.ReleaseFromNode(ctx, r.GetVolumeTargetPath()); err != nil {
		return nil, err
	}
	return &crustv1.ReleaseFromNodeResponse{}, nil
}

func (s *volumes) ListNodeHolds(context.Context, *crustv1.ListNodeHoldsRequest) (*crustv1.ListNodeHoldsResponse, error) {
	return &crustv1.ListNodeHoldsResponse{Holds: s.m.NodeHolds()}, nil
}

// runtime serves RuntimeService for runtime handlers.
type runtime struct {
	crustv1.UnimplementedRuntimeServiceServer
	m   *manager.Manager
	out func(*crustv1.Volume) *crustv1.Volume // see answers
}

func (s *runtime) ClaimVolume(ctx context.Context, r *crustv1.ClaimVolumeRequest) (*crustv1.ClaimVolumeResponse, error) {
	// The caller is recorded with the claim, so that crustd notices when that handler is gone.
	if cred, ok := peercred.FromContext(ctx); ok {
		ctx = manager.WithClaimer(ctx, cred.Pid)
	}
	v, err := s.m.Claim(ctx, r.GetVolumeTargetPath(), r.GetSandboxId(), r.GetHandlerEndpoint())
	if err != nil {
		return nil, err
	}
	return &crustv1.ClaimVolumeResponse{Volume: v}, nil
}

func (s *runtime) ReleaseVolume(ctx context.Context, r *crustv1.ReleaseVolumeRequest) (*crustv1.ReleaseVolumeResponse, error) {
	if err := s.m.Release(ctx, r.GetVolumeTargetPath(), r.GetSandboxId(), r.GetForce()); err != nil {
		return nil, err
	}
	return &crustv1.ReleaseVolumeResponse{}, nil
}

func (s *runtime) WatchVolumes(r *crustv1.WatchVolumesRequest, stream grpc.ServerStreamingServer[crustv1.WatchVolumesResponse]) error {
	var w *manager.Watcher
	if r.SinceRevision != nil {
		var err error
		if w, err = s.m.WatchSince(r.GetSinceRevision(), r.GetSendExisting()); err != nil {
			return err
		}
	} else {
		w = s.m.Watch(r.GetSendExisting())
	}
	defer w.Stop()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case ev, ok := <-w.Events():
			if !ok {
				return w.Err()
			}
			if err := stream.Send(event(ev, s.out)); err != nil {
				return err
			}
		}
	}
}

func (s *runtime) CheckRawDevice(ctx context.Context, r *crustv1.CheckRawDeviceRequest) (*crustv1.CheckRawDeviceResponse, error) {
	if err := s.m.CheckRawDevice(ctx, r.GetSandboxId(), r.GetDevice(), r.GetReadOnly()); err != nil {
		return nil, err
	}
	return &crustv1.CheckRawDeviceResponse{}, nil
}

// info serves InfoService: an answer made once, as nothing in it changes while crustd runs.
type info struct {
	crustv1.UnimplementedInfoServiceServer
	resp *crustv1.GetInfoResponse
}

// APIVersions are the API versions crustd serves, as protobuf package names, oldest first.
var APIVersions = []string{string(crustv1.File_crust_v1_crust_proto.Package())}

func newInfo(features []string) *info {
	v := version.Get()
	return &info{resp: &crustv1.GetInfoResponse{
		Version: v.Version, Revision: v.Revision, ApiVersions: APIVersions,
		Features: slices.Compact(slices.Sorted(slices.Values(features))),
	}}
}

func (s *info) GetInfo(context.Context, *crustv1.GetInfoRequest) (*crustv1.GetInfoResponse, error) {
	return s.resp, nil // never changed: gRPC only encodes it
}
