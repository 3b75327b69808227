package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/recordfile"
	"crust.dev/crust/internal/store"
)

// A busy node: 100,000 realistic descriptors (kubelet's paths, cloud-style volume ids, pod-info
// metadata), far past gRPC's 4 MiB default in one answer. ListVolumes answers in pages that each fit,
// with tokens that walk every descriptor once, and crustctl ls lists them all.
func TestListVolumesAtScale(t *testing.T) {
	const pods, perPod = 25_000, 4
	// State and kubelet tree on tmpfs: writing 100,000 records is then quick.
	root := tmpfsDir(t, "crust-scale", "1g")
	kubelet, state := filepath.Join(root, "kubelet"), filepath.Join(root, "state")
	dev := loopDevice(t, 16<<20)
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	boot, err := recordfile.ReadBootID()
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := store.Open(state, boot, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for p := range pods {
		uid := fmt.Sprintf("%08x-1c2d-4e5f-8a9b-%012x", p, p*7919)
		for i := range perPod {
			pv := fmt.Sprintf("pvc-%08x-0000-4000-8000-%012x", p, i)
			dir := filepath.Join(kubelet, "pods", uid, "volumes", "kubernetes.io~csi", pv)
			if err := os.MkdirAll(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			err := s.Put(&crustv1.Volume{
				Spec: &crustv1.VolumeSpec{
					VolumeTargetPath: filepath.Join(dir, "mount"), VolumeBackingPath: dev, VolumeType: crustv1.VolumeType_VOLUME_TYPE_BLOCK,
					FsType: "ext4", MountFlags: []string{"noatime"}, CreateFilesystem: true,
					VolumeId:  fmt.Sprintf("projects/crust-prod/zones/europe-west4-a/disks/%s", pv),
					CsiDriver: "pd.csi.storage.gke.io", PodUid: uid,
					Metadata: map[string]string{"csi.storage.k8s.io/pod.name": fmt.Sprintf("web-%d-7d9f8b6c5d-x2k4q", p),
						"csi.storage.k8s.io/pod.namespace": "team-storefront-production", "csi.storage.k8s.io/pod.uid": uid},
				},
				ResolvedBackingPath: dev,
				DeviceNumber:        &crustv1.DeviceNumber{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)},
				StageTime:           timestamppb.Now(),
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Close() // for crustd
	t.Logf("wrote %d records in %s", pods*perPod, time.Since(t0).Round(100*time.Millisecond))
	t0 = time.Now()
	d := newDaemon(t, "--state-dir", state, "--kubelet-dir", kubelet, "--kata-dir", "")
	t.Logf("crustd serving %d descriptors after %s", pods*perPod, time.Since(t0).Round(100*time.Millisecond))

	c := crustv1.NewVolumeServiceClient(d.conn())
	ctx := context.Background()
	seen, pages, largest, last := 0, 0, 0, ""
	for token := ""; ; pages++ {
		r, err := c.ListVolumes(ctx, &crustv1.ListVolumesRequest{StartingToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		largest = max(largest, proto.Size(r))
		for _, v := range r.GetVolumes() {
			if p := v.GetSpec().GetVolumeTargetPath(); p <= last {
				t.Fatalf("page %d: %s after %s: not in order, or seen twice", pages, p, last)
			} else {
				last = p
			}
		}
		seen += len(r.GetVolumes())
		if token = r.GetNextToken(); token == "" {
			break
		}
	}
	if seen != pods*perPod || largest >= 4<<20 {
		t.Fatalf("%d descriptors in %d pages, the largest %d bytes; want %d, each under 4 MiB", seen, pages+1, largest, pods*perPod)
	}
	t.Logf("%d descriptors in %d pages, the largest %.1f MiB", seen, pages+1, float64(largest)/(1<<20))
	if r, err := c.ListVolumes(ctx, &crustv1.ListVolumesRequest{MaxEntries: 7}); err != nil || len(r.GetVolumes()) != 7 || r.GetNextToken() == "" {
		t.Fatalf("max_entries 7: %d descriptors, next %q, %v", len(r.GetVolumes()), r.GetNextToken(), err)
	}
	for _, bad := range []*crustv1.ListVolumesRequest{{MaxEntries: -1}, {StartingToken: "not-a-token"}} {
		if _, err := c.ListVolumes(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want INVALID_ARGUMENT", bad, err)
		}
	}

	t0 = time.Now()
	out, err := exec.Command(filepath.Join(binDir, "crustctl"), "--socket", d.socket, "ls").Output()
	if err != nil {
		t.Fatalf("crustctl ls: %v", err)
	}
	lines := 0
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		lines++
	}
	if lines != pods*perPod+1 {
		t.Fatalf("crustctl ls printed %d lines, want a header and %d descriptors", lines, pods*perPod)
	}
	t.Logf("crustctl ls of %d descriptors: %s", pods*perPod, time.Since(t0).Round(100*time.Millisecond))
}
