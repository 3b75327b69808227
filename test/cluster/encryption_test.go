package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/volume"
	"crust.dev/crust/internal/testutil"
)

// A PVC of an encrypting StorageClass (crust.dev/encryption: luks2, the key in a Secret named by the
// class's node-publish-secret parameters), used by a microVM pod: the pod's filesystem lies on a
// dm-crypt mapping in the guest; crustd holds the key in the descriptor and answers it redacted; the
// volume's device on the node holds a LUKS2 header and neither the data nor the key; and the key is in
// no file or log of the node that the test can read (everything the cluster writes under $RUN, and the
// node's /run) but crustd's records and the Kata projection's mountInfo.json, both mode 0600 on the
// node's tmpfs. The API server's store (etcd), which holds the Secret itself, is left out. Once the Secret
// holds another key, the next microVM pod fails to start with "wrong key" in an Event, the device
// unchanged; and a runc pod given the same PVC is refused, as only a sandbox may open the volume.
func TestEncryptedVolume(t *testing.T) {
	c, ctx, ns := begin(t)
	key, data := "key-"+testutil.RandomHex(t, 24), testutil.RandomHex(t, 40)
	if _, err := c.cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "crust-key"},
		StringData: map[string]string{volume.EncryptionSecretKey: key}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc, err := c.cs.StorageV1().StorageClasses().Get(ctx, deferClass, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	enc := sc.DeepCopy()
	enc.ObjectMeta = metav1.ObjectMeta{Name: "enc-" + ns}
	enc.Parameters[volume.EncryptionParamKey] = volume.EncryptionLUKS2
	enc.Parameters["csi.storage.k8s.io/node-publish-secret-name"] = "crust-key"
	enc.Parameters["csi.storage.k8s.io/node-publish-secret-namespace"] = ns
	if _, err := c.cs.StorageV1().StorageClasses().Create(ctx, enc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cs.StorageV1().StorageClasses().Delete(context.Background(), enc.Name, metav1.DeleteOptions{})
	})
	c.pvcOfClass(t, ns, "data", "64Mi", enc.Name, nil)
	pod := c.runPod(t, ns, podSpec("vm", microVMClass, nil, claimVolume("data", "data")))

	vols := c.podVolumes(t, string(pod.UID))
	if len(vols) != 1 {
		t.Fatalf("crustd holds %d descriptors for the pod, want 1", len(vols))
	}
	if got := vols[0].GetSpec().GetMetadata()[volume.EncryptionKey]; got != volume.Redacted {
		t.Fatalf("the descriptor's %s is %q, want it held and answered %s", volume.EncryptionKey, got, volume.Redacted)
	}
	// crustctl's answers, every Event of the cluster, and the metrics of crustd and of every crust proxy
	// on the node hold no key; the Kata projection's mountInfo.json holds it as Kata writes it.
	target := vols[0].GetSpec().GetVolumeTargetPath()
	answers := c.kubectlOK(t, "-n", "crust-system", "exec", "daemonset/crustd", "--", "crustctl", "-o", "json", "ls") +
		c.kubectlOK(t, "-n", "crust-system", "exec", "daemonset/crustd", "--", "crustctl", "-o", "yaml", "get", target) +
		c.kubectlOK(t, "-n", "crust-system", "exec", "daemonset/crustd", "--", "crustctl", "direct-volume", "list")
	if strings.Contains(answers, key) || !strings.Contains(answers, volume.Redacted) {
		t.Errorf("crustctl's answers hold the key %v, or do not show it redacted:\n%s", strings.Contains(answers, key), answers)
	}
	evs, err := c.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if strings.Contains(e.Message, key) {
			t.Errorf("event %s/%s (%s) holds the key", e.Namespace, e.Name, e.Reason)
		}
	}
	scraped := 0
	for _, url := range c.crustMetricsURLs(t) {
		if strings.Contains(c.scrapeNode(t, url), key) {
			t.Errorf("%s holds the key", url)
		}
		scraped++
	}
	t.Logf("%d events and %d metrics endpoints hold no key", len(evs.Items), scraped)

	vm := c.shell(t, ns, "vm", "c")
	if src := vm.ExecOK("awk", `$2 == "/data" {print $1}`, "/proc/mounts"); !strings.HasPrefix(src, "/dev/dm-") && !strings.HasPrefix(src, "/dev/mapper/") {
		t.Fatalf("/data in the container is a mount of %q, not of a dm-crypt mapping", src)
	}
	vm.ExecOK("sh", "-c", "printf %s "+data+" >/data/f && sync")

	// Every file of the node that holds the key is one of crust's two that must, 0600 on tmpfs.
	allowed, kataFiles := 0, 0
	for _, path := range filesHolding(t, []byte(key), c.run, c.nsPath("/run")) {
		switch {
		case strings.HasPrefix(path, c.nsPath("/run/kata-containers/shared/direct-volumes/")) && filepath.Base(path) == "mountInfo.json":
			var mi kata.MountInfo
			if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &mi) != nil || mi.Metadata[kata.MetadataEncryptionKey] != key {
				t.Errorf("the Kata projection %s does not carry the key as Kata's %s metadata: %+v, %v", path, kata.MetadataEncryptionKey, mi, err)
			}
			kataFiles++
			fallthrough
		case strings.HasPrefix(path, c.nsPath("/run/crust/")):
			allowed++
			if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("%s holds the key with mode %v (%v), want 0600", path, st.Mode().Perm(), err)
			}
		default:
			t.Errorf("%s holds the key", path)
		}
	}
	if allowed == 0 {
		t.Error("no record of crustd holds the key: the test did not look where it is")
	}
	if kataFiles != 1 {
		t.Errorf("%d Kata projections hold the key, want the volume's", kataFiles)
	}
	t.Logf("the key is in %d files, all crust's records on the node's /run", allowed)

	// The pod gone (the volume closed in its guest), the device holds a LUKS2 header and ciphertext.
	c.deletePod(t, ns, "vm")
	device := c.nsPath(vols[0].GetSpec().GetVolumeBackingPath())
	disk := testutil.ReadDevice(t, device)
	if !bytes.HasPrefix(disk, []byte("LUKS\xba\xbe\x00\x02")) {
		t.Errorf("the volume's device %s starts with %q, not a LUKS2 header", device, disk[:8])
	}
	if bytes.Contains(disk, []byte(data)) || bytes.Contains(disk, []byte(key)) {
		t.Errorf("the node reads the data or the key on the volume's device %s", device)
	}

	// Another key in the Secret: the next pod's sandbox cannot open the volume, says so, and writes nothing.
	if _, err := c.cs.CoreV1().Secrets(ns).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "crust-key"},
		StringData: map[string]string{volume.EncryptionSecretKey: "other-" + key}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.createPod(t, ns, podSpec("vm2", microVMClass, nil, claimVolume("data", "data")))
	t.Logf("pod given another key: %s", c.waitPodEvent(t, ns, "vm2", "Failed", "wrong key"))
	c.deletePod(t, ns, "vm2")
	if !bytes.Equal(testutil.ReadDevice(t, device), disk) {
		t.Error("the volume's device changed under another key")
	}

	// A pod on the host would get the volume in the clear: refused.
	c.createPod(t, ns, podSpec("runc", runcClass, nil, claimVolume("data", "data")))
	t.Logf("runc pod: %s", c.waitPodEvent(t, ns, "runc", "FailedMount", "runs on the host"))
	if p, err := c.cs.CoreV1().Pods(ns).Get(ctx, "runc", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Fatalf("the runc pod runs with the encrypted volume: %v, %v", p.Status.Phase, err)
	}
	c.deletePod(t, ns, "runc")
}

// filesHolding returns the regular files under roots that hold secret, leaving out the API server's store
// ($RUN/etcd) and the volume group's backing file ($RUN/vg), whose volume is read on its own. Links are
// not followed; a file that cannot be read (a namespace's handle, say) is passed over.
func filesHolding(t *testing.T, secret []byte, roots ...string) []string {
	t.Helper()
	var found []string
	read := 0
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return nil
			case d.IsDir() && (d.Name() == "etcd" || d.Name() == "vg") && filepath.Dir(path) == root:
				return filepath.SkipDir
			case !d.Type().IsRegular():
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			read++
			if bytes.Contains(b, secret) {
				found = append(found, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("read %d files under %v", read, roots)
	return found
}

// crustMetricsURLs are the /metrics URLs of crustd and of every crust-csi-proxy container on the node
// (their --http-addr, on the node's loopback).
func (c *cluster) crustMetricsURLs(t *testing.T) []string {
	t.Helper()
	pods, err := c.cs.CoreV1().Pods("").List(ctxT(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			if ctr.Name != "crustd" && !strings.HasPrefix(ctr.Name, "crust-csi-proxy") {
				continue
			}
			for _, a := range ctr.Args {
				if addr, ok := strings.CutPrefix(a, "--http-addr="); ok && strings.HasPrefix(addr, "127.0.0.1:") {
					urls = append(urls, "http://"+addr+"/metrics")
				}
			}
		}
	}
	if len(urls) == 0 {
		t.Fatal("no crust container serves metrics on the node's loopback")
	}
	return urls
}

// scrapeNode GETs url, on the node's loopback, and returns the body.
func (c *cluster) scrapeNode(t *testing.T, url string) string {
	t.Helper()
	out, err := exec.Command("curl", "--silent", "--show-error", "--fail", "--max-time", "10", url).CombinedOutput()
	if err != nil {
		t.Fatalf("GET %s: %v: %.300s", url, err, out)
	}
	return string(out)
}
