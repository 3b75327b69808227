package vm

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/examples/microvm/agentproto/agentv1"
	"crust.dev/crust/internal/testutil"
)

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestEncryptedVolumeInGuest takes a blank disk through the agent as an encrypted volume in one TCG
// guest: formatted as LUKS2 and opened with the key, written, grown online (the mapping and then the
// filesystem, as df shows), closed at unmount; a wrong key is refused with the disk unchanged. The host
// then reads the disk and finds a LUKS2 header and neither the data nor the key, and a second guest opens
// it with stock cryptsetup alone and reads the data. An integrity-protected volume is made and used too,
// and its growth refused.
func TestEncryptedVolumeInGuest(t *testing.T) {
	ctx, v := tcgGuest(t, 15*time.Minute)
	agent := v.Agent()
	dev := loopDevice(t, 64*mib)
	key, data := []byte(testutil.RandomHex(t, 32)), testutil.RandomHex(t, 48)
	if err := v.AttachBlock(ctx, "vol-enc", dev.path, false); err != nil {
		t.Fatal(err)
	}
	const target = "/mnt/enc"
	// Refused before the disk is touched: no key, a key too long, a raw block volume.
	for _, bad := range []*agentv1.MountRequest{
		{Serial: "vol-enc", Target: target, CreateFilesystem: true, Encryption: &agentv1.Encryption{}},
		{Serial: "vol-enc", Target: target, CreateFilesystem: true, Encryption: &agentv1.Encryption{Key: bytes.Repeat([]byte("k"), 513)}},
		{Serial: "vol-enc", Target: "/dev/xvdz", Block: true, Encryption: &agentv1.Encryption{Key: key}},
	} {
		if _, err := agent.Mount(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("mount %v: %v; want InvalidArgument", bad, err)
		}
	}
	enc := &agentv1.MountRequest{Serial: "vol-enc", Target: target, FsType: "ext4", CreateFilesystem: true,
		Encryption: &agentv1.Encryption{Key: key}}
	res, err := agent.Mount(ctx, enc)
	if err != nil || !res.Formatted {
		t.Fatalf("mount: %+v, %v; want formatted", res, err)
	}
	if src := execOK(t, v, "awk", `$2 == "`+target+`" {print $1}`, "/proc/mounts"); !strings.Contains(src, "dm-") && !strings.Contains(src, "/dev/mapper/") {
		t.Fatalf("%s is a mount of %s, not of a dm-crypt mapping", target, src)
	}
	if res, err := agent.Mount(ctx, enc); err != nil || !res.Already {
		t.Fatalf("mount again: %+v, %v; want already", res, err)
	}
	execOK(t, v, "sh", "-c", "printf %s "+data+" >"+target+"/data && sync")

	// Online growth: the disk, then the mapping, then the filesystem, while mounted.
	before, err := agent.Statfs(ctx, &agentv1.StatfsRequest{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	dev.growInVM(ctx, t, v, "vol-enc", 96*mib)
	g, err := agent.Grow(ctx, &agentv1.GrowRequest{Target: target, MinDeviceBytes: 96 * mib})
	if err != nil || g.DeviceBytes != 96*mib || g.CapacityBytes < before.GetBytes().GetTotal()+24*mib {
		t.Fatalf("grow = %+v, %v; want the filesystem of %d bytes grown by about 32 MiB", g, err, before.GetBytes().GetTotal())
	}
	if df := execOK(t, v, "sh", "-c", "df -k "+target+" | awk 'NR == 2 {print $2}'"); df != strconv.FormatUint(g.CapacityBytes/1024, 10) {
		t.Fatalf("df in the guest shows %s KiB; grow answered %d bytes", df, g.CapacityBytes)
	}
	if got := execOK(t, v, "cat", target+"/data"); got != data {
		t.Fatalf("data after growth: %q", got)
	}
	if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: target}); err != nil {
		t.Fatal(err)
	}
	if names := execOK(t, v, "sh", "-c", "cat /sys/block/dm-*/dm/name 2>/dev/null; true"); names != "" {
		t.Fatalf("mappings left after unmount: %s", names)
	}

	// A wrong key: refused as such, nothing written, no mapping left.
	sum := fileSum(t, dev.file)
	wrong := &agentv1.MountRequest{Serial: "vol-enc", Target: target, FsType: "ext4", CreateFilesystem: true,
		Encryption: &agentv1.Encryption{Key: []byte("not-the-key")}}
	if _, err := agent.Mount(ctx, wrong); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "wrong key") ||
		strings.Contains(err.Error(), "not-the-key") {
		t.Fatalf("mount with a wrong key: %v; want FailedPrecondition saying so, without the key", err)
	}
	if fileSum(t, dev.file) != sum {
		t.Fatal("the disk changed under a wrong key")
	}
	if names := execOK(t, v, "sh", "-c", "cat /sys/block/dm-*/dm/name 2>/dev/null; true"); names != "" {
		t.Fatalf("mappings left after a wrong key: %s", names)
	}
	if err := v.DetachBlock(ctx, "vol-enc"); err != nil {
		t.Fatal(err)
	}

	// On the host: a LUKS2 header, and neither the data nor the key anywhere on the disk.
	disk, err := os.ReadFile(dev.file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(disk, []byte("LUKS\xba\xbe\x00\x02")) {
		t.Fatalf("the disk starts with %q, not a LUKS2 header", disk[:8])
	}
	if bytes.Contains(disk, []byte(data)) || bytes.Contains(disk, key) {
		t.Fatal("the host reads the data or the key on the disk")
	}

	// Authenticated encryption: formatted with dm-integrity under dm-crypt, used, and not grown.
	idev := loopDevice(t, 32*mib)
	if err := v.AttachBlock(ctx, "vol-int", idev.path, false); err != nil {
		t.Fatal(err)
	}
	integ := &agentv1.MountRequest{Serial: "vol-int", Target: "/mnt/int", FsType: "ext4", CreateFilesystem: true,
		Encryption: &agentv1.Encryption{Key: key, Integrity: true}}
	if _, err := agent.Mount(ctx, integ); err != nil {
		t.Fatalf("mount with integrity: %v", err)
	}
	if tables := execOK(t, v, "sh", "-c", "cat /sys/block/dm-*/dm/name"); !strings.Contains(tables, "crust-vol-int_dif") {
		t.Fatalf("no dm-integrity device under the mapping: %s", tables)
	}
	execOK(t, v, "sh", "-c", "printf %s "+data+" >/mnt/int/data && sync")
	if _, err := agent.Grow(ctx, &agentv1.GrowRequest{Target: "/mnt/int"}); !errors.Is(err, errdefs.ErrUnimplemented) {
		t.Fatalf("grow with integrity: %v; want Unimplemented", err)
	}
	if _, err := agent.Unmount(ctx, &agentv1.UnmountRequest{Target: "/mnt/int"}); err != nil {
		t.Fatal(err)
	}
	if err := v.DetachBlock(ctx, "vol-int"); err != nil {
		t.Fatal(err)
	}

	// A second guest opens the first volume with stock cryptsetup, given the same key, and reads the data.
	ctx2, v2 := tcgGuest(t, 10*time.Minute)
	if err := v2.AttachBlock(ctx2, "vol-enc", dev.path, false); err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Agent().Mount(ctx2, &agentv1.MountRequest{Serial: "vol-enc", Target: "/dev/xvde", Block: true}); err != nil {
		t.Fatal(err)
	}
	// The agent loads dm-crypt in the background after boot: wait for the module, then use cryptsetup alone.
	execOK(t, v2, "sh", "-c", "until grep -qx live /sys/module/dm_crypt/initstate 2>/dev/null; do sleep 0.05; done")
	got := execOK(t, v2, "sh", "-c", "mkdir -p /run/cryptsetup /m && printf %s "+string(key)+
		" | cryptsetup open --type luks2 --key-file=- /dev/xvde plain && mount -o ro /dev/mapper/plain /m && cat /m/data")
	if got != data {
		t.Fatalf("the second guest reads %q", got)
	}
}
