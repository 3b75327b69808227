package e2e

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil"
	"crust.dev/crust/internal/testutil/harness"
)

// stageEncrypted stages target on dev, ext4 formatted when blank, with key as its encryptionKey.
func stageEncrypted(t *testing.T, d *daemon, target, dev, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := crustv1.NewVolumeServiceClient(d.conn()).StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: &crustv1.VolumeSpec{
		VolumeTargetPath: target, VolumeBackingPath: dev, FsType: "ext4", CreateFilesystem: true,
		Metadata: map[string]string{"encryptionKey": key}}}); err != nil {
		t.Fatal(err)
	}
}

// logged waits until m has logged a line with msg holding each of has (opening a LUKS2 volume takes
// seconds of a loaded TCG guest) and returns its value of key.
func logged(t *testing.T, m *harness.MicroVM, msg, key string, has ...string) string {
	t.Helper()
	var v string
	harness.Eventually(t, 2*time.Minute, "crust-microvm to log "+strconv.Quote(msg), func() bool {
		v = m.LogValue(msg, key, has...)
		return v != ""
	})
	return v
}

// TestMicroVMEncryptedVolume runs a volume whose metadata holds an encryptionKey through crustd and
// crust-microvm (TCG): a release forced while the handler attaches it is taken back; the blank device
// is formatted as LUKS2 and opened in the guest, where the
// filesystem lies on the mapping; stats come through crustd and an online expansion grows the device, the
// mapping and the filesystem, as df in the guest shows. After stop the host finds a LUKS2 header and
// neither the data nor the key on the device, and the key in no log. A second sandbox given the same
// device with another key is refused, its claim released and the device unchanged.
func TestMicroVMEncryptedVolume(t *testing.T) {
	d, assets := newMicroVMDaemon(t)
	pod := "3c9e0f1a-0000-4000-8000-00000000e2e7"
	target, dev := d.podTarget(pod, "pvc-encrypted"), loopDevice(t, 64*mib)
	key, data := "key-"+testutil.RandomHex(t, 24), testutil.RandomHex(t, 40)
	stageEncrypted(t, d, target, dev, key)

	m := startMicroVM(t, d, assets, t.TempDir(), "e2e-crypt", target+":/data")
	// An operator forces the release while the handler attaches the volume (the guest formats it as LUKS2
	// for seconds): the handler claims it again, as it would a mounted one, and mounts it claimed.
	harness.Eventually(t, time.Minute, "crust-microvm to claim the volume", func() bool {
		return getVolume(t, d, target).GetClaim().GetSandboxId() == "e2e-crypt"
	})
	if _, errOut, code := d.crustctl("release", target, "--force"); code != 0 {
		t.Fatalf("release --force: exit %d: %s", code, errOut)
	}
	if m.LogValue("volume mounted", "target", "target="+target) != "" {
		t.Log("the volume was mounted before the release was forced: the attach's window was not exercised")
	}
	if err := <-m.WaitMountedAsync("/data"); err != nil {
		t.Fatal(err)
	}
	if got := logged(t, m, "crustd ended the claim of a volume mounted in the guest; claimed it again", "reason"); got != "RELEASE_REASON_FORCED" {
		t.Errorf("claimed again, logged with reason %q:\n%s", got, m.Log())
	}
	harness.Eventually(t, time.Minute, "crust-microvm to hold the claim of its mounted volume", func() bool {
		return getVolume(t, d, target).GetClaim().GetSandboxId() == "e2e-crypt"
	})
	if src := m.ExecOK("awk", `$2 == "/data" {print $1}`, "/proc/mounts"); !strings.Contains(src, "dm-") {
		t.Fatalf("/data is a mount of %s, not of a dm-crypt mapping", src)
	}
	m.ExecOK("sh", "-c", "printf %s "+data+" >/data/f && sync")
	before := statsOf(t, d, target)
	if before.total == 0 || before.used == 0 {
		t.Fatalf("stats of the encrypted volume: %+v", before)
	}
	after := expandTo(t, d, target, dev, 128*mib)
	if after.total < before.total+56*mib {
		t.Fatalf("stats after the expansion to 128 MiB: %+v; before %+v", after, before)
	}
	if df := m.ExecOK("sh", "-c", "df -k /data | awk 'NR == 2 {print $2}'"); df != strconv.FormatInt(after.total/1024, 10) {
		t.Fatalf("df in the guest shows %s KiB; stats say %d bytes", df, after.total)
	}
	m.Stop()
	if strings.Contains(m.Log(), key) {
		t.Errorf("crust-microvm logged the key")
	}
	if c := getVolume(t, d, target).GetClaim(); c != nil {
		t.Errorf("%s still claimed after stop: %v", target, c)
	}
	disk := testutil.ReadDevice(t, dev)
	if !bytes.HasPrefix(disk, []byte("LUKS\xba\xbe\x00\x02")) {
		t.Fatalf("the device starts with %q, not a LUKS2 header", disk[:8])
	}
	if bytes.Contains(disk, []byte(data)) || bytes.Contains(disk, []byte(key)) {
		t.Fatal("the host reads the data or the key on the device")
	}

	// Another sandbox, the same device, another key: refused, released, nothing written.
	if _, errOut, code := d.crustctl("unstage", "--target-path", target); code != 0 {
		t.Fatalf("unstage: exit %d: %s", code, errOut)
	}
	wrong := d.podTarget(pod, "pvc-wrong-key")
	stageEncrypted(t, d, wrong, dev, "other-"+key)
	m2 := startMicroVM(t, d, assets, t.TempDir(), "e2e-crypt-2", wrong+":/data")
	if got := logged(t, m2, "volume not attached; trying again when its descriptor changes", "err", "target="+wrong); !strings.Contains(got, "wrong key") {
		t.Errorf("the volume given another key: handler says %q", got)
	}
	// Released after the refusal (the watch's first replay may have the handler try once more, and fail
	// the same way, before it rests).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := harness.Poll(ctx, func() (bool, error) { return getVolume(t, d, wrong).GetClaim() == nil, nil }); err != nil {
		t.Errorf("the refused volume is still claimed: %v", getVolume(t, d, wrong).GetClaim())
	}
	m2.Stop()
	if strings.Contains(m2.Log(), key) {
		t.Errorf("crust-microvm logged the key")
	}
	if !bytes.Equal(testutil.ReadDevice(t, dev), disk) {
		t.Error("the device changed under another key")
	}
}
