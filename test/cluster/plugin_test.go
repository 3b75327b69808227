package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestKubectlPlugin runs `kubectl crust` as an operator would, kubectl finding kubectl-crust on PATH.
func TestKubectlPlugin(t *testing.T) {
	c, _, ns := begin(t)
	pod := c.runPod(t, ns, podSpec("vm", microVMClass, nil, claimVolume("data", c.pvc(t, ns, "data", "64Mi").Name)))
	vols := c.podVolumes(t, string(pod.UID))
	if len(vols) != 1 {
		t.Fatalf("crustd holds %d descriptors of the pod, want 1", len(vols))
	}
	target := vols[0].GetSpec().GetVolumeTargetPath()
	plugin := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(c.kubectl, append([]string{"crust"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+c.binDir+":"+os.Getenv("PATH"), "KUBECONFIG="+c.kubeconfig)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("kubectl crust %s: %v", strings.Join(args, " "), err)
		}
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	// row reports whether out has a row of the node that names target.
	row := func(out string) bool {
		for s := bufio.NewScanner(strings.NewReader(out)); s.Scan(); {
			if f := strings.Fields(s.Text()); len(f) > 1 && f[0] == c.node && f[1] == target {
				return true
			}
		}
		return false
	}
	for _, args := range [][]string{{"ls"}, {"ls", "--node", c.node}, {"get", target}, {"get", target, "--node", c.node}} {
		out, errs, code := plugin(args...)
		t.Logf("kubectl crust %s:\n%s", strings.Join(args, " "), out)
		if code != 0 || !row(out) {
			t.Errorf("kubectl crust %s: exit %d, no row of node %s for %s:\n%s%s", strings.Join(args, " "), code, c.node, target, out, errs)
		}
	}

	out, errs, code := plugin("ls", "-o", "json")
	var doc struct {
		Items []struct {
			Node    string            `json:"node"`
			Volumes []json.RawMessage `json:"volumes"`
		} `json:"items"`
	}
	err := json.Unmarshal([]byte(out), &doc)
	if err != nil || code != 0 || len(doc.Items) != 1 || doc.Items[0].Node != c.node || !strings.Contains(out, `"volume_target_path": "`+target+`"`) {
		t.Errorf("kubectl crust ls -o json: exit %d, %v:\n%s%s", code, err, out, errs)
	}

	if out, errs, code := plugin("ls", "--node", "no-such-node"); code != 1 || !strings.Contains(errs, "no crustd pod on node no-such-node") {
		t.Errorf("kubectl crust ls --node no-such-node: exit %d:\n%s%s", code, out, errs)
	}
	if out, errs, code := plugin("get", "/var/lib/kubelet/pods/none/volumes/kubernetes.io~csi/none/mount"); code != 1 || !strings.Contains(errs, "NotFound: no crustd holds") {
		t.Errorf("kubectl crust get of an unknown target: exit %d:\n%s%s", code, out, errs)
	}
	// Other tests may leave problems for doctor to find (3); it must ask the node either way.
	if out, errs, code := plugin("doctor"); (code != 0 && code != 3) || !strings.HasPrefix(out, c.node+" ") {
		t.Errorf("kubectl crust doctor: exit %d:\n%s%s", code, out, errs)
	}
}
