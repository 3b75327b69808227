package hostdev

import (
	"os"
	"path/filepath"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil"
)

func TestRefreshSeesAGrownLoopDevice(t *testing.T) {
	dev, img := testutil.Loop(t, 8<<20)

	for _, tc := range []struct {
		name  string
		grow  int64
		want  int64
		vtype crustv1.VolumeType
		path  string
	}{
		{"unchanged", 0, 8 << 20, crustv1.VolumeType_VOLUME_TYPE_BLOCK, dev},
		{"backing file grown", 16 << 20, 16 << 20, crustv1.VolumeType_VOLUME_TYPE_BLOCK, dev},
		{"again is a no-op", 0, 16 << 20, crustv1.VolumeType_VOLUME_TYPE_BLOCK, dev},
		{"image file", 0, 16 << 20, crustv1.VolumeType_VOLUME_TYPE_FILE, img},
	} {
		if tc.grow > 0 {
			if err := os.Truncate(img, tc.grow); err != nil {
				t.Fatal(err)
			}
		}
		before, err := Size(tc.path, tc.vtype)
		if err != nil {
			t.Fatalf("%s: size: %v", tc.name, err)
		}
		if tc.grow > 0 && tc.vtype == crustv1.VolumeType_VOLUME_TYPE_BLOCK && before == tc.want {
			t.Fatalf("%s: Size saw the grown backing file (%d) before Refresh told the loop device", tc.name, before)
		}
		got, err := Refresh(tc.path, tc.vtype)
		if err != nil || got != tc.want {
			t.Fatalf("%s: %d, %v; want %d", tc.name, got, err, tc.want)
		}
		if after, err := Size(tc.path, tc.vtype); err != nil || after != tc.want {
			t.Fatalf("%s: size after refresh %d, %v; want %d", tc.name, after, err, tc.want)
		}
	}
	if _, err := Refresh(filepath.Join(t.TempDir(), "gone"), crustv1.VolumeType_VOLUME_TYPE_BLOCK); err == nil {
		t.Fatal("a missing device refreshed")
	}
}
