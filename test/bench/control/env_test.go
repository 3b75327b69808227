package control

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/benchfig"
	"crust.dev/crust/internal/testutil/harness"
)

// bins holds crustd, crustctl and grpcfloor, built once per process.
var bins struct {
	once                        sync.Once
	dir                         string
	crustd, crustctl, grpcfloor string
	err                         error
}

func buildBins(b *testing.B) {
	b.Helper()
	bins.once.Do(func() {
		if bins.dir, bins.err = benchfig.ScratchDir(); bins.err != nil {
			return
		}
		bins.err = harness.Build(bins.dir, "crust.dev/crust/cmd/crustd", "crust.dev/crust/cmd/crustctl",
			"crust.dev/crust/test/bench/cmd/grpcfloor")
		bins.crustd, bins.crustctl = filepath.Join(bins.dir, "crustd"), filepath.Join(bins.dir, "crustctl")
		bins.grpcfloor = filepath.Join(bins.dir, "grpcfloor")
	})
	if bins.err != nil {
		b.Fatal(bins.err)
	}
}

// Filesystem magic numbers (statfs(2)).
const (
	tmpfsMagic = unix.TMPFS_MAGIC
	ext4Magic  = unix.EXT4_SUPER_MAGIC
)

// dirOn returns a new directory, removed when b ends, on a filesystem of type magic: on /dev/shm for
// tmpfs, under the system's temp directory or the repository's _output for ext4. It skips b, naming what
// it tried, when none is of that type.
func dirOn(b *testing.B, magic int64, name string) string {
	b.Helper()
	var candidates []string
	if magic == tmpfsMagic {
		candidates = []string{"/dev/shm"}
	} else {
		candidates = []string{os.TempDir(), filepath.Join(harness.ModuleRoot(b), "_output")}
	}
	for _, c := range candidates {
		var st unix.Statfs_t
		if err := os.MkdirAll(c, 0o755); err != nil || unix.Statfs(c, &st) != nil || st.Type != magic {
			continue
		}
		d, err := os.MkdirTemp(c, "crust-bench-"+name+"-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(d) })
		return d
	}
	b.Skipf("skipping: none of %v is on a filesystem of type %#x", candidates, magic)
	return ""
}

// env is a crustd process whose state directory and Kata directory are where the benchmark says, with
// volumes ready to stage.
type env struct {
	d      *harness.Crustd
	vols   crustv1.VolumeServiceClient
	health healthpb.HealthClient // crustd's health service: an empty round trip to crustd
	specs  []*crustv1.VolumeSpec
}

// startEnv starts crustd with its store in stateDir and its Kata projection in kataDir, and makes n
// volumes (sparse image files and kubelet-shaped targets) to stage.
func startEnv(b *testing.B, stateDir, kataDir string, n int, extra ...string) *env {
	b.Helper()
	buildBins(b)
	images := b.TempDir()
	args := append([]string{"--state-dir", stateDir, "--kata-dir", kataDir, "--cri-endpoint", "",
		"--allow-file-backed", "--device-allow", images + "/*", "--allow-uid", strconv.Itoa(os.Geteuid())}, extra...)
	d := harness.StartCrustd(b, bins.crustd, args...)
	e := &env{d: d}
	conn, err := crustd.Dial(d.Socket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	e.vols, e.health = crustv1.NewVolumeServiceClient(conn), healthpb.NewHealthClient(conn)
	e.specs = e.makeVolumes(b, images, "pv", n)
	return e
}

// startGRPCFloor starts grpcfloor (gRPC's health service alone, in a process of its own) and returns a
// client of it made as crustd's clients are.
func startGRPCFloor(b *testing.B) healthpb.HealthClient {
	b.Helper()
	buildBins(b)
	sock := filepath.Join(testutil.SocketDir(b), "floor.sock")
	harness.StartProc(b, harness.ProcConfig{Bin: bins.grpcfloor, Args: []string{sock}, Ready: harness.Serving(sock)})
	conn, err := crustd.Dial(sock)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// makeVolumes makes n sparse 64 MiB image files in images and kubelet-shaped targets for them, and
// returns their specs.
func (e *env) makeVolumes(b *testing.B, images, prefix string, n int) []*crustv1.VolumeSpec {
	b.Helper()
	specs := make([]*crustv1.VolumeSpec, n)
	for i := range specs {
		pv := fmt.Sprintf("%s-%d", prefix, i)
		img := filepath.Join(images, pv+".img")
		f, err := os.Create(img)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Truncate(64 << 20); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
		pod := fmt.Sprintf("0e0e0e0e-0000-4000-8000-%012d", i/100)
		specs[i] = &crustv1.VolumeSpec{
			VolumeTargetPath: e.d.PodTarget(b, pod, pv), VolumeBackingPath: img,
			VolumeType: crustv1.VolumeType_VOLUME_TYPE_FILE, FsType: "ext4", VolumeId: pv,
			CsiDriver: "bench.csi", PodUid: pod,
		}
	}
	return specs
}

// stage and unstage make one call each, failing b on an error.
func (e *env) stage(ctx context.Context, b *testing.B, spec *crustv1.VolumeSpec) {
	if _, err := e.vols.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: spec}); err != nil {
		b.Fatalf("StageVolume %s: %v", spec.GetVolumeId(), err)
	}
}

func (e *env) unstage(ctx context.Context, b *testing.B, spec *crustv1.VolumeSpec) {
	if _, err := e.vols.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: spec.GetVolumeTargetPath()}); err != nil {
		b.Fatalf("UnstageVolume %s: %v", spec.GetVolumeId(), err)
	}
}

// timeEach runs op(i) for i in [0, n) and returns the mean time of one.
func timeEach(n int, op func(i int)) time.Duration {
	t0 := time.Now()
	for i := range n {
		op(i)
	}
	return time.Since(t0) / time.Duration(n)
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// ratio is a/b as a float.
func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// mustJSON is the protojson encoding of m, as crustd's store writes it.
func mustJSON(b *testing.B, m proto.Message) []byte {
	b.Helper()
	data, err := protojson.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return data
}
