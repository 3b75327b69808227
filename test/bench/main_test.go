// Package bench holds crust's end-to-end benchmarks, each a side-by-side comparison made within one run and
// reported as a ratio, since the machines they run on are too noisy for absolute figures to mean much:
//
//   - BenchmarkStageToMounted: StageVolume on crustd until the volume is mounted in the guest of a running
//     crust-microvm handler (in process), against the bare hot-plug and mount (vm.AttachBlock and the
//     agent's mount) on another VM; the ratio is crust's overhead.
//   - BenchmarkPublishToMounted: the same from NodePublishVolume on crust-csi-proxy (in process, in front
//     of crust-lvm-csi on a throw-away volume group) of a fresh, blank volume, which the guest formats,
//     against a blank device hot-plugged and mounted with create_filesystem; the ratio is the overhead of
//     the whole node path, the driver's publish included.
//   - BenchmarkGuestThroughput: sequential write and read in one guest (generic kernel) on an ext4 volume
//     attached as a virtio-blk disk, against an ext4 of the same size mounted on the host and shared into
//     the same guest over virtio-9p, through the guest's page cache (buffered) and around it (o_direct);
//     the ratios are what the direct path gains.
//   - BenchmarkPmemDAX: cold sequential read, write+fsync and small-file create+sync in one guest on a
//     persistent-memory volume attached as virtio-pmem and mounted with DAX, against a copy of the same
//     image attached as a virtio-blk disk; the ratios are what DAX gains (under TCG; its doc comment says
//     what KVM would change).
//   - BenchmarkDataPath: small files, sequential and random I/O (fio) and SQLite commits in one guest
//     (generic kernel) on a volume attached as crust attaches it (virtio-blk), against a virtio-fs share
//     in Kata's default cache mode and a 9p share of the same filesystem, with the host's page cache in
//     neither path and in both, and the same workloads on the host and on the guest's tmpfs as ceilings;
//     the ratios blk/virtiofs have a target of 5 on small files, random reads and SQLite commits.
//   - BenchmarkManyVolumes: 32 volumes attached (vm.AttachBlock) and mounted one after another in one
//     guest with 32 hot-plug ports; the ratio is the 32nd volume's time over the 1st's, and one more
//     volume must be refused with an error naming the limit. It also compares the boot of that guest
//     with one of the default 8 ports: what the ports cost.
//   - BenchmarkShimPod: containers run through containerd 1.6 and crust-microvm's containerd shim, a
//     new sandbox (VM boot) each op, with one volume either deferred (staged in crustd, claimed by the
//     shim and mounted in the guest) or mounted on the host and shared over virtio-fs (Kata's default):
//     the start's ratio (p50 and p99), SQLite commits and fio random reads in the container, the RSS of
//     the shim, QEMU and virtiofsd, and the time from delete to everything released.
//
// They boot QEMU guests, need root (loop devices, mounts), and skip with the reason when not root or when
// QEMU or the guest assets (hack/guest/fetch-kernel.sh --with-9p into CRUST_GUEST_ASSETS, else
// _output/guest) are missing; BenchmarkDataPath also without virtiofsd (qemu-system-common), and its fio
// figures without fio (Debian package fio). They build crustd, crust-guest and the guests' initramfs
// from this tree themselves. The guests run under TCG, as everywhere in crust's tests (KVM guests hang on the machines
// crust is developed on); CRUST_BENCH_ACCEL=kvm or auto asks for KVM where it works. Each op takes up to
// seconds, so run them with a fixed count:
//
//	go test -run '^$' -bench . -benchtime 7x ./test/bench
//
// which is what `make bench` does (BENCH_OPS=N for another count). Nothing here runs without -bench.
package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"crust.dev/crust/api/crustd"
	"crust.dev/crust/examples/microvm/initramfs"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/benchfig"
	"crust.dev/crust/internal/testutil/harness"
)

func TestMain(m *testing.M) {
	os.Exit(benchfig.RunMain(m, "vm", "crust.dev/crust/test/bench"))
}

// build holds what is built once per process: crustd, crust-guest, the guest initramfs of each flavour
// (and set of extra files), and the programs the benchmarks run in guests.
var build struct {
	once   sync.Once
	dir    string
	err    error
	crustd string
	mu     sync.Mutex
	guests map[string]guestImages // by flavour and extra files' label
	progs  map[string]string      // by package: the static binary
}

// guestImages are a kernel and an initramfs with this tree's crust-guest, and a directory laid out as
// crust-microvm's --assets wants (FLAVOUR/vmlinux, initramfs-FLAVOUR.cpio).
type guestImages struct {
	kernel, initrd, assets string
}

func assetsDir() string {
	if d := os.Getenv("CRUST_GUEST_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(moduleRoot(), "_output", "guest")
}

// moduleRoot is the repository's root: the directory of the go.work that ties its modules.
func moduleRoot() string {
	dir, _ := os.Getwd()
	for ; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
	}
	return "."
}

// needVMs skips b unless it runs as root with QEMU installed.
func needVMs(b *testing.B) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("skipping: needs root (loop devices, mounts, QEMU guests)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		b.Skip("skipping: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86, or make deps)")
	}
}

// buildBinaries builds crustd and crust-guest into the process's build directory, once.
func buildBinaries(b *testing.B) {
	b.Helper()
	build.once.Do(func() {
		build.dir, build.err = benchfig.ScratchDir()
		if build.err != nil {
			return
		}
		for _, pkg := range []string{"crust.dev/crust/cmd/crustd", "crust.dev/crust/examples/microvm/cmd/crust-guest"} {
			if build.err = goBuild(pkg, build.dir); build.err != nil {
				return
			}
		}
		build.crustd = filepath.Join(build.dir, "crustd")
		build.guests = map[string]guestImages{}
		build.progs = map[string]string{}
	})
	if build.err != nil {
		b.Fatal(build.err)
	}
}

// goBuild builds the main package pkg of this repository statically (CGO_ENABLED=0) into dir.
func goBuild(pkg, dir string) error {
	c := exec.Command("go", "build", "-o", dir+"/", pkg)
	c.Dir = moduleRoot()
	c.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(c.Args, " "), err, out)
	}
	return nil
}

// program returns the static binary of the main package pkg of this repository, built once.
func program(b *testing.B, pkg string) string {
	b.Helper()
	buildBinaries(b)
	build.mu.Lock()
	defer build.mu.Unlock()
	if p, ok := build.progs[pkg]; ok {
		return p
	}
	dir := filepath.Join(build.dir, "prog-"+strconv.Itoa(len(build.progs)))
	if err := goBuild(pkg, dir); err != nil {
		b.Fatal(err)
	}
	p := filepath.Join(dir, path.Base(pkg))
	build.progs[pkg] = p
	return p
}

// guest returns the images of flavour ("cloud", or "generic" for 9p and virtio-fs), skipping b when the
// kernel assets are missing.
func guest(b *testing.B, flavour string) guestImages {
	b.Helper()
	return guestWith(b, flavour, "", nil)
}

// guestWith is guest with files added to the initramfs (initramfs.Guest.Files); label names the set of
// files, distinct among the sets a process uses.
func guestWith(b *testing.B, flavour, label string, files []initramfs.File) guestImages {
	b.Helper()
	needVMs(b)
	src := assetsDir()
	a, err := initramfs.LoadAssets(src, flavour)
	if err != nil {
		fetch := "hack/guest/fetch-kernel.sh " + src
		if flavour != "cloud" {
			fetch = "hack/guest/fetch-kernel.sh --with-9p " + src
		}
		b.Skipf("skipping: no %s guest assets (make bench fetches them; or %s): %v", flavour, fetch, err)
	}
	buildBinaries(b)
	build.mu.Lock()
	defer build.mu.Unlock()
	key := flavour
	if label != "" {
		key += "-" + label
	}
	if g, ok := build.guests[key]; ok {
		return g
	}
	dir := filepath.Join(build.dir, "assets-"+key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	g := guestImages{kernel: a.Kernel, initrd: filepath.Join(dir, "initramfs-"+flavour+".cpio"), assets: dir}
	err = initramfs.Guest{Agent: filepath.Join(build.dir, "crust-guest"), Modules: a.Modules, Tools: a.Tools, Files: files}.WriteFile(g.initrd)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(src, flavour), filepath.Join(dir, flavour)); err != nil {
		b.Fatal(err)
	}
	build.guests[key] = g
	return g
}

// loop is a loop device on an image file.
type loop struct{ dev, file string }

// newLoop makes a sparse image file of size bytes in dir, formats it ext4 and attaches it to a loop
// device.
func newLoop(b *testing.B, dir string, size int64) loop {
	b.Helper()
	file := sparseFile(b, dir, "disk-*.img", size)
	harness.Run(b, "mkfs.ext4", "-q", "-F", file)
	return loop{dev: harness.Run(b, "losetup", "--find", "--show", file), file: file}
}

// sparseFile makes a new sparse file of size bytes in dir, named after pattern as os.CreateTemp does,
// and returns its path.
func sparseFile(b *testing.B, dir, pattern string, size int64) string {
	b.Helper()
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	return f.Name()
}

// free detaches the loop device and removes its file.
func (l loop) free(b *testing.B) {
	b.Helper()
	if out, err := exec.Command("losetup", "-d", l.dev).CombinedOutput(); err != nil {
		b.Errorf("losetup -d %s: %v: %s", l.dev, err, out)
	}
	_ = os.Remove(l.file)
}

// daemon is a crustd process on temp dirs (harness.Crustd), stopped at cleanup, with a connection.
type daemon struct {
	*harness.Crustd
	socket string
	conn   *grpc.ClientConn
}

// startCrustd starts crustd with extra flags (a later flag wins).
func startCrustd(b *testing.B, extra ...string) *daemon {
	b.Helper()
	buildBinaries(b)
	c := harness.StartCrustd(b, build.crustd, append([]string{"--kata-dir", "", "--log-level", "warn"}, extra...)...)
	conn, err := crustd.Dial(c.Socket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return &daemon{Crustd: c, socket: c.Socket, conn: conn}
}

// target returns a kubelet-shaped publish target path for volume pv of pod, with the pod's directories made.
func (d *daemon) target(b *testing.B, pod, pv string) string {
	b.Helper()
	return d.PodTarget(b, pod, pv)
}

// hook is a slog.Handler that keeps the text log (for failures) and tells, on events, of the records
// whose message is one of the watched ones, with their attributes (those given through With included).
type hook struct {
	inner slog.Handler
	attrs map[string]slog.Value
	out   *hookOut
}

// hookOut is the text log (Write, String) and the events of the watched messages.
type hookOut struct {
	harness.SyncBuffer
	watch  map[string]bool
	events chan logEvent
}

// logEvent is a watched record: when it was logged, its message and its attributes.
type logEvent struct {
	at    time.Time
	msg   string
	attrs map[string]slog.Value
}

func newHook(watch ...string) (*slog.Logger, *hookOut) {
	o := &hookOut{watch: map[string]bool{}, events: make(chan logEvent, 256)}
	for _, m := range watch {
		o.watch[m] = true
	}
	h := &hook{inner: slog.NewTextHandler(o, &slog.HandlerOptions{Level: slog.LevelDebug}), attrs: map[string]slog.Value{}, out: o}
	return slog.New(h), o
}

func (h *hook) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *hook) Handle(ctx context.Context, r slog.Record) error {
	if h.out.watch[r.Message] {
		ev := logEvent{at: time.Now(), msg: r.Message, attrs: map[string]slog.Value{}}
		for k, v := range h.attrs {
			ev.attrs[k] = v
		}
		r.Attrs(func(a slog.Attr) bool { ev.attrs[a.Key] = a.Value.Resolve(); return true })
		select {
		case h.out.events <- ev:
		default: // nobody reads: drop rather than block the handler
		}
	}
	return h.inner.Handle(ctx, r)
}

func (h *hook) WithAttrs(as []slog.Attr) slog.Handler {
	n := &hook{inner: h.inner.WithAttrs(as), attrs: map[string]slog.Value{}, out: h.out}
	for k, v := range h.attrs {
		n.attrs[k] = v
	}
	for _, a := range as {
		n.attrs[a.Key] = a.Value.Resolve()
	}
	return n
}

func (h *hook) WithGroup(name string) slog.Handler {
	return &hook{inner: h.inner.WithGroup(name), attrs: h.attrs, out: h.out}
}

// accel is the guests' accelerator: CRUST_BENCH_ACCEL, or TCG.
func accel() vm.Accel {
	if a := os.Getenv("CRUST_BENCH_ACCEL"); a != "" {
		return vm.Accel(a)
	}
	return vm.AccelTCG
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msEach is ms of each of ds, as a figure's samples.
func msEach(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = ms(d)
	}
	return out
}

func mean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(max(1, len(ds)))
}
