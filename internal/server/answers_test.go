package server

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/manager"
)

// anySpec is a manager.Validator that takes every spec as it is, so that the server's answers can be
// tried on a manager without devices.
type anySpec struct{}

func (anySpec) Volume(s *crustv1.VolumeSpec) (*crustv1.Volume, error) {
	return &crustv1.Volume{Spec: proto.CloneOf(s), DeviceNumber: &crustv1.DeviceNumber{Major: 7}}, nil
}
func (anySpec) NodeHold(h *crustv1.NodeHold) (*crustv1.Volume, error) {
	return &crustv1.Volume{Spec: &crustv1.VolumeSpec{VolumeTargetPath: h.GetVolumeTargetPath()}, NodeHold: h}, nil
}
func (anySpec) TargetName(string, string) error            { return nil }
func (anySpec) SameDevice(*crustv1.Volume) error           { return nil }
func (anySpec) SandboxID(string, string) error             { return nil }
func (anySpec) HandlerEndpoint(string, string) error       { return nil }
func (anySpec) Put(*crustv1.Volume) error                  { return nil } // and a store that keeps nothing
func (anySpec) Delete(string) error                        { return nil }
func (anySpec) Annotate(v *crustv1.Volume) *crustv1.Volume { return tagged(v) }

// tagged is v with a caveat, as an annotator adds one.
func tagged(v *crustv1.Volume) *crustv1.Volume {
	if v == nil {
		return nil
	}
	c := proto.CloneOf(v)
	c.KataCaveats = []string{"tagged"}
	return c
}

// TestAnswersAreAnnotatedAndRedacted: StageVolume, GetVolume, ListVolumes and WatchVolumes events carry
// what the annotators add and secret metadata redacted; the manager's own volume and the events it
// shares with every watcher keep neither.
func TestAnswersAreAnnotatedAndRedacted(t *testing.T) {
	m, err := manager.Open(manager.Config{Validator: anySpec{}, Store: anySpec{}}, manager.Loaded{})
	if err != nil {
		t.Fatal(err)
	}
	out := answers([]Annotator{anySpec{}})
	s := &volumes{m: m, out: out}
	ctx := context.Background()
	const target = "/kubelet/pods/p/volumes/v/mount"
	w := m.Watch(false)
	defer w.Stop()
	spec := &crustv1.VolumeSpec{VolumeTargetPath: target, Metadata: map[string]string{"encryptionKey": "k"}}
	want := func(how string, v *crustv1.Volume) {
		t.Helper()
		if !slices.Equal(v.GetKataCaveats(), []string{"tagged"}) || v.GetSpec().GetMetadata()["encryptionKey"] != volume.Redacted {
			t.Errorf("%s: caveats %q, metadata %v; want annotated and redacted", how, v.GetKataCaveats(), v.GetSpec().GetMetadata())
		}
	}
	staged, err := s.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	got, gerr := s.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: target})
	list, lerr := s.ListVolumes(ctx, &crustv1.ListVolumesRequest{})
	if gerr != nil || lerr != nil || len(list.GetVolumes()) != 1 {
		t.Fatalf("GetVolume: %v; ListVolumes = %v, %v", gerr, list, lerr)
	}
	for how, v := range map[string]*crustv1.Volume{"StageVolume": staged.GetVolume(), "GetVolume": got.GetVolume(),
		"ListVolumes": list.GetVolumes()[0]} {
		want(how, v)
	}
	ev := <-w.Events()
	want("WatchVolumes", event(ev, out).GetVolume())
	held, err := m.Get(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	for how, v := range map[string]*crustv1.Volume{"the manager's volume": held, "the shared event": ev.GetVolume()} {
		if len(v.GetKataCaveats()) > 0 || v.GetSpec().GetMetadata()["encryptionKey"] != "k" {
			t.Errorf("%s was changed: caveats %q, metadata %v", how, v.GetKataCaveats(), v.GetSpec().GetMetadata())
		}
	}
}
