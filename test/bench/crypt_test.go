package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/examples/microvm/vm"
	"crust.dev/crust/internal/testutil/benchfig"
)

// BenchmarkEncryptedVolume compares, in one guest, an encrypted volume with a plain one, attached alike:
// two blank images on loop devices with direct I/O to their files, hot-plugged as virtio-blk disks and
// mounted by the agent as crust-microvm mounts them, both formatted ext4 in the guest, the encrypted one
// as LUKS2 first and mounted on its dm-crypt mapping (aes-xts-plain64, cryptsetup's default). The
// workloads are BenchmarkDataPath's: fio's 4 KiB random reads and writes at queue depth 1 and 32 (the
// guest's caches dropped before; the host's page cache is in neither path), and SQLite commits in WAL
// and rollback-journal mode. Each op is a round of every workload on both volumes, which goes first
// rotating from round to round. Figures: per round, the encrypted volume's rate over the plain one's
// ("crypt/<workload>-luks2-vs-plain"), then the rates. Without fio on the host only SQLite is measured.
//
// Under TCG the guest's AES runs emulated (no AES-NI): the ratio is a floor, which KVM with AES-NI
// raises towards 1 for these small, latency-bound operations.
func BenchmarkEncryptedVolume(b *testing.B) {
	needVMs(b)
	g, load, fio, fioErr := dataloadGuest(b, "cloud")
	work := b.TempDir()
	devs := map[string]string{}
	for _, n := range []string{"plain", "luks2"} {
		img := filepath.Join(work, n+".img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(img, dpImage); err != nil {
			b.Fatal(err)
		}
		devs[n] = attachLoop(b, img, true)
	}
	v := startVM(b, vm.Config{Kernel: g.kernel, Initramfs: g.initrd, MemoryMB: 768})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, n := range []string{"plain", "luks2"} {
		if err := v.AttachBlock(ctx, n, devs[n], false); err != nil {
			b.Fatal(err)
		}
		args := &agentv1.MountRequest{Serial: n, FsType: "ext4", Target: "/bench/" + n, CreateFilesystem: true}
		if n == "luks2" {
			args.Encryption = &agentv1.Encryption{Key: []byte("a-benchmark-key-of-some-length")}
		}
		if _, err := v.Agent().Mount(ctx, args); err != nil {
			b.Fatal(err)
		}
	}
	mounts := guestRun(b, v, "cat /proc/mounts")
	if !strings.Contains(mounts, " /bench/plain ext4 ") || !strings.Contains(mounts, "/dev/dm-0 /bench/luks2 ext4 ") {
		b.Fatalf("the guest's mounts lack the plain volume or the encrypted one's mapping:\n%s", mounts)
	}
	b.Logf("guest kernel %s (%s); fio: %s; dm-crypt's cipher: %s", v.Boot().Kernel, v.Boot().Accel, fioState(fio, fioErr),
		guestRun(b, v, `awk '/^name/ {n = $3} /^driver/ && n == "xts(aes)" {print "xts(aes) by " $3; exit}' /proc/crypto`))

	plain, luks := &dpPath{name: "plain", dir: "/bench/plain"}, &dpPath{name: "luks2", dir: "/bench/luks2"}
	r := &dpRun{b: b, v: v, prog: load}
	if fioErr == nil {
		for _, p := range []*dpPath{plain, luks} {
			r.load(p, "write", "-file", p.dir+"/fio", "-mib", strconv.Itoa(dpFioMiB))
		}
	}
	if r.rounds(func(round int) {
		ps := rotate([]*dpPath{plain, luks}, round)
		if fioErr == nil {
			for _, p := range ps {
				r.dropCaches(false)
				r.fio(p, func(w, unit string, v float64) { r.rate(p, w, unit, v) })
			}
		}
		r.sqlite(ps)
	}) == 0 {
		return
	}
	for _, w := range r.order {
		n, d := r.rates[w][luks.name], r.rates[w][plain.name]
		s := make([]float64, len(n))
		for i := range n {
			s[i] = n[i] / d[i]
		}
		benchfig.Record(b, benchfig.Figure{Name: "crypt/" + w + "-luks2-vs-plain", Unit: "x", Samples: s,
			About: w + ": the LUKS2 volume's rate over the plain volume's, in one guest"})
	}
	r.recordRates("crypt/")
}
