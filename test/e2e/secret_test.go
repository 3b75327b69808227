package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/api/kata"
)

// TestEncryptionKeyIsSecret runs a volume with an encryptionKey through stage, watch, get, list, claim,
// release, a refused restage and unstage, against a real crustd logging at debug level, and looks for the
// key's value everywhere a person or a program could see it. Only the ClaimVolume answer (for the handler
// that attaches the volume) and the two files Kata and crustd read back (mode 0600) may hold it.
func TestEncryptionKeyIsSecret(t *testing.T) {
	d := newDaemon(t, "--log-level", "debug")
	var b [12]byte
	_, _ = rand.Read(b[:])
	secret := "key-" + hex.EncodeToString(b[:])
	devA, devB := loopDevice(t, 16<<20), loopDevice(t, 16<<20)
	targetA, targetB := d.podTarget("pod-secret-a", "pv"), d.podTarget("pod-secret-b", "pv")
	spec := func(target, dev string) *crustv1.VolumeSpec {
		return &crustv1.VolumeSpec{VolumeTargetPath: target, VolumeBackingPath: dev, FsType: "ext4",
			Metadata: map[string]string{"encryptionKey": secret, "createFilesystem": "true",
				"csi.storage.k8s.io/pod.name": "web-0"}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vols := crustv1.NewVolumeServiceClient(d.conn())
	rt := crustv1.NewRuntimeServiceClient(d.conn())

	// checkRedacted fails when v shows the secret, or does not show that a key is there.
	checkRedacted := func(what string, v *crustv1.Volume) {
		t.Helper()
		md := v.GetSpec().GetMetadata()
		if md["encryptionKey"] != "<redacted>" || md["csi.storage.k8s.io/pod.name"] != "web-0" {
			t.Errorf("%s: metadata %v, want encryptionKey <redacted> beside the pod name", what, md)
		}
	}
	noSecret := func(what, out string) {
		t.Helper()
		if strings.Contains(out, secret) {
			t.Errorf("%s shows the encryption key:\n%s", what, out)
		}
	}

	st, err := vols.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: spec(targetA, devA)})
	if err != nil {
		t.Fatal(err)
	}
	checkRedacted("StageVolume's answer", st.GetVolume())
	if !st.GetVolume().GetSpec().GetCreateFilesystem() {
		t.Errorf("createFilesystem \"true\" in the metadata did not set create_filesystem: %v", st.GetVolume().GetSpec())
	}

	// A watch that starts after A was staged sees it as EXISTING, then (once it is SYNCED, so that B is
	// not in its first list) B's changes live.
	stream, err := rt.WatchVolumes(ctx, &crustv1.WatchVolumesRequest{SendExisting: true})
	if err != nil {
		t.Fatal(err)
	}
	want := func(types ...crustv1.EventType) {
		t.Helper()
		for _, want := range types {
			ev, err := stream.Recv()
			if err != nil || ev.GetType() != want {
				t.Fatalf("event %v, %v; want %v", ev, err, want)
			}
			if want != crustv1.EventType_EVENT_TYPE_SYNCED {
				checkRedacted("the "+want.String()+" event", ev.GetVolume())
			}
			noSecret("the "+want.String()+" event", ev.String())
		}
	}
	want(crustv1.EventType_EVENT_TYPE_EXISTING, crustv1.EventType_EVENT_TYPE_SYNCED)
	if _, err := vols.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: spec(targetB, devB)}); err != nil {
		t.Fatal(err)
	}
	claim, err := rt.ClaimVolume(ctx, &crustv1.ClaimVolumeRequest{VolumeTargetPath: targetB, SandboxId: "sb-secret"})
	if err != nil {
		t.Fatal(err)
	}
	// The claiming handler gets the key whole: it needs it to open the volume.
	if got := claim.GetVolume().GetSpec().GetMetadata()["encryptionKey"]; got != secret {
		t.Errorf("ClaimVolume answers encryptionKey %q, want the key itself", got)
	}
	if _, err := rt.ReleaseVolume(ctx, &crustv1.ReleaseVolumeRequest{VolumeTargetPath: targetB, SandboxId: "sb-secret"}); err != nil {
		t.Fatal(err)
	}
	// Staging A again with another key is refused, and the answer names neither key.
	other := spec(targetA, devA)
	other.Metadata["encryptionKey"] = secret + "-other"
	_, err = vols.StageVolume(ctx, &crustv1.StageVolumeRequest{Spec: other})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("restage with another key: %v, want AlreadyExists", err)
	}
	noSecret("the AlreadyExists error", status.Convert(err).Message())

	want(crustv1.EventType_EVENT_TYPE_STAGED, crustv1.EventType_EVENT_TYPE_CLAIMED, crustv1.EventType_EVENT_TYPE_RELEASED)

	g, err := vols.GetVolume(ctx, &crustv1.GetVolumeRequest{VolumeTargetPath: targetA})
	if err != nil {
		t.Fatal(err)
	}
	checkRedacted("GetVolume", g.GetVolume())
	l, err := vols.ListVolumes(ctx, &crustv1.ListVolumesRequest{})
	if err != nil || len(l.GetVolumes()) != 2 {
		t.Fatalf("ListVolumes: %v, %v", l, err)
	}
	for _, v := range l.GetVolumes() {
		checkRedacted("ListVolumes", v)
	}

	// crustctl, in every output format, and the operator's other views.
	for _, args := range [][]string{
		{"get", targetA}, {"get", targetA, "-o", "json"}, {"get", targetA, "-o", "yaml"}, {"get", targetA, "-o", "table"},
		{"ls"}, {"ls", "-o", "json"}, {"ls", "-o", "yaml"}, {"ls", "-o", "table"},
		{"claim", targetA, "--sandbox-id", "sb-ctl"}, {"claim", targetA, "--sandbox-id", "sb-ctl", "-o", "yaml"},
		{"release", targetA, "--sandbox-id", "sb-ctl"},
		{"doctor"}, {"doctor", "-o", "json"},
		{"direct-volume", "get", "--kata-dir", d.kata, "--volume-path", targetA},
		{"direct-volume", "get", "--kata-dir", d.kata, "--volume-path", targetA, "-o", "yaml"},
		{"direct-volume", "list", "--kata-dir", d.kata, "-o", "json"},
	} {
		out, errOut, code := d.crustctl(args...)
		if code != 0 {
			t.Fatalf("crustctl %v: exit %d: %s", args, code, errOut)
		}
		noSecret("crustctl "+strings.Join(args, " "), out+errOut)
		if args[0] == "get" && len(args) > 2 && args[3] != "table" && !strings.Contains(out, "<redacted>") {
			t.Errorf("crustctl %v does not say the key is there:\n%s", args, out)
		}
	}
	// crustctl watch streams until stopped; it has the watch's answers, so a short run shows them.
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	defer wcancel()
	var wout bytes.Buffer
	cmd := exec.CommandContext(wctx, filepath.Join(binDir, "crustctl"), "--socket", d.socket, "watch", "--existing")
	cmd.Stdout, cmd.Stderr = &wout, &wout
	_ = cmd.Run()
	if !strings.Contains(wout.String(), targetA) {
		t.Errorf("crustctl watch --existing showed no volume:\n%s", wout.String())
	}
	noSecret("crustctl watch", wout.String())

	// The two files that must hold the key are readable by their owner only.
	files := 0
	for _, dir := range []string{d.state, d.kata} {
		err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil || !holdsSecret(b, secret) {
				return err
			}
			files++
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s holds the key with mode %v (%v), want 0600", p, fi.Mode().Perm(), err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files != 4 { // a record and a mountInfo.json for each of A and B
		t.Errorf("%d files hold the key, want 4 (the records and mountInfo.json files)", files)
	}
	mi, err := kata.Get(d.kata, targetA)
	if err != nil || mi.Metadata["encryptionKey"] != secret || mi.Metadata["createFilesystem"] != "true" {
		t.Errorf("Kata reads %+v (%v), want the key itself and createFilesystem true", mi, err)
	}

	for _, target := range []string{targetA, targetB} {
		if _, err := vols.UnstageVolume(ctx, &crustv1.UnstageVolumeRequest{VolumeTargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	d.Stop()
	if !strings.Contains(d.Log(), "msg=call") || !strings.Contains(d.Log(), "request=") {
		t.Fatalf("crustd logged no requests at debug level:\n%s", d.Log())
	}
	noSecret("crustd's log", d.Log())
}

// holdsSecret reports whether file content b holds secret: in its bytes, or in the descriptor of a store
// record, which version 2 of the record keeps as the base64 of its protobuf encoding.
func holdsSecret(b []byte, secret string) bool {
	if bytes.Contains(b, []byte(secret)) {
		return true
	}
	var rec struct {
		Volume []byte `json:"volume"` // a JSON string: its base64 is decoded
	}
	return json.Unmarshal(b, &rec) == nil && bytes.Contains(rec.Volume, []byte(secret))
}
