package kubectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	utilexec "k8s.io/client-go/util/exec"
)

func pod(name, node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{"app.kubernetes.io/name": "crustd"}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

const (
	volA = `{"volumes":[{"spec":{"volume_target_path":"/var/lib/kubelet/pods/a/volumes/kubernetes.io~csi/pv-a/mount","volume_backing_path":"/dev/loop1","fs_type":"ext4","volume_type":"VOLUME_TYPE_BLOCK"}}]}`
	volB = `{"volumes":[{"spec":{"volume_target_path":"/var/lib/kubelet/pods/b/volumes/kubernetes.io~csi/pv-b/mount","volume_backing_path":"/dev/loop2","fs_type":"xfs","volume_type":"VOLUME_TYPE_BLOCK"}}]}`
)

// node is what crustctl in one node's pod does: its stdout, stderr and exit status per command.
type node map[string]struct {
	out, err string
	code     int
}

// cluster returns a Connect to a fake API server holding pods, whose exec runs crustctl as nodes say,
// and records the commands it ran.
func cluster(t *testing.T, nodes map[string]node, pods ...*corev1.Pod) (Connect, *[]string) {
	var ran []string
	cs := fake.NewClientset()
	for _, p := range pods {
		if _, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(_ context.Context, p *corev1.Pod, cmd []string) ([]byte, []byte, error) {
		ran = append(ran, p.Name+": "+strings.Join(cmd, " "))
		if !slices.Equal(cmd[:3], []string{"crustctl", "-o", "json"}) {
			t.Errorf("ran %q, want crustctl -o json ...", cmd)
		}
		r, ok := nodes[p.Spec.NodeName][cmd[3]]
		if !ok {
			return nil, []byte("error: unable to upgrade connection: container not found"), errors.New("exec failed")
		}
		var err error
		if r.code != 0 {
			err = utilexec.CodeExitError{Err: errors.New("command terminated with non-zero exit code"), Code: r.code}
		}
		return []byte(r.out), []byte(r.err), err
	}
	return func(string, string) (kubernetes.Interface, Exec, error) { return cs, exec, nil }, &ran
}

func TestCommands(t *testing.T) {
	notFound := struct {
		out, err string
		code     int
	}{err: "crustctl: NotFound: no volume at /x\n", code: 1}
	nodes := map[string]node{
		"n1": {"ls": {out: volA}, "doctor": {out: `{}`}, "get": notFound},
		"n2": {"ls": {out: volB}, "doctor": {out: `{"problems":[{"kind":"PROBLEM_KIND_CORRUPT_RECORD","path":"/run/crust/q/x","message":"damaged","remedy":"delete it"}]}`, code: 3},
			"get": {out: `{"spec":{"volume_target_path":"/x","volume_backing_path":"/dev/loop2"}}`}},
	}
	pods := []*corev1.Pod{pod("crustd-b", "n2", corev1.PodRunning), pod("crustd-a", "n1", corev1.PodRunning),
		pod("crustd-old", "n1", corev1.PodPending), pod("elsewhere", "", corev1.PodPending)}
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		want     []string // lines of stdout, in order, each as a prefix after white space is folded
		stderr   string
		ranCount int
	}{
		{name: "ls every node", args: []string{"ls"}, want: []string{"NODE TARGET DEVICE", "n1 /var/lib/kubelet/pods/a/", "n2 /var/lib/kubelet/pods/b/"}, ranCount: 2},
		{name: "ls one node", args: []string{"ls", "--node", "n2"}, want: []string{"NODE TARGET", "n2 /var/lib/kubelet/pods/b/"}, ranCount: 1},
		{name: "unknown node", args: []string{"ls", "--node", "n9"}, code: 1, stderr: "no crustd pod on node n9 in namespace crust-system"},
		{name: "get finds the node that holds it", args: []string{"get", "/x"}, want: []string{"NODE TARGET", "n2 /x /dev/loop2"}, ranCount: 2},
		{name: "get found nowhere", args: []string{"get", "/x", "--node", "n1"}, code: 1, stderr: "NotFound: no crustd holds /x (asked 1 nodes)", ranCount: 1},
		{name: "doctor with problems", args: []string{"doctor"}, code: 3, want: []string{"n1 no problems found", "n2 PROBLEM corrupt_record", "n2 TARGET -", "n2 PATH /run/crust/q/x"}, ranCount: 2},
		{name: "bad output", args: []string{"ls", "-o", "csv"}, code: 2, stderr: `-o: "csv" is not table`},
		{name: "wrong namespace", args: []string{"ls", "-n", "other"}, code: 1, stderr: "no crustd pod in namespace other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connect, ran := cluster(t, nodes, pods...)
			var stdout, stderr bytes.Buffer
			if code := Main(tc.args, &stdout, &stderr, connect); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.code, stderr.String())
			}
			t.Logf("stdout:\n%s", stdout.String())
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.stderr)
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			i := 0
			for _, l := range lines {
				if i < len(tc.want) && strings.HasPrefix(strings.Join(strings.Fields(l), " "), tc.want[i]) {
					i++
				}
			}
			if i < len(tc.want) {
				t.Errorf("stdout lacks %q (in order):\n%s", tc.want[i], stdout.String())
			}
			if len(*ran) != tc.ranCount {
				t.Errorf("ran %d commands, want %d: %q", len(*ran), tc.ranCount, *ran)
			}
			for _, r := range *ran {
				if strings.HasPrefix(r, "crustd-old") {
					t.Errorf("asked the pod that does not run: %s", r)
				}
			}
		})
	}
}

// A node whose crustd cannot be asked is named on stderr; the others are still shown, and the status is 1.
func TestNodeThatFails(t *testing.T) {
	connect, _ := cluster(t, map[string]node{"n1": {"ls": {out: volA}}, "n2": {}},
		pod("crustd-a", "n1", corev1.PodRunning), pod("crustd-b", "n2", corev1.PodRunning))
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"ls", "-o", "json"}, &stdout, &stderr, connect); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "node n2: pod crustd-b: error: unable to upgrade connection") {
		t.Errorf("stderr: %s", stderr.String())
	}
	var doc struct {
		Items []struct {
			Node    string            `json:"node"`
			Volumes []json.RawMessage `json:"volumes"`
		} `json:"items"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if len(doc.Items) != 1 || doc.Items[0].Node != "n1" || len(doc.Items[0].Volumes) != 1 {
		t.Errorf("json: %s", stdout.String())
	}
}

// TestInject: `kubectl crust inject` takes -n as the namespace of objects that name none, says on stderr
// what it did, talks to no cluster, and writes nothing when it refuses.
func TestInject(t *testing.T) {
	noCluster := func(string, string) (kubernetes.Interface, Exec, error) {
		t.Fatal("inject connected to a cluster")
		return nil, nil, nil
	}
	const in = "../../inject/testdata/statefulset.yaml"
	var out, errb bytes.Buffer
	if code := Main([]string{"inject", "-n", "storage", "-f", in}, &out, &errb, noCluster); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "name: crust-csi-proxy-controller") || !strings.Contains(out.String(), "name: crust-csi-proxy:storage:csi-hostpathplugin-sa") {
		t.Errorf("output lacks the proxies or the binding in namespace storage:\n%s", out.String())
	}
	if !strings.HasPrefix(errb.String(), "injected StatefulSet storage/csi-hostpathplugin: kubelet dials ") {
		t.Errorf("stderr %q", errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := Main([]string{"inject", "-f", in}, &out, &errb, noCluster); code != 1 || out.Len() > 0 ||
		!strings.Contains(errb.String(), "StatefulSet csi-hostpathplugin: it names no namespace") {
		t.Errorf("without -n: exit %d, stdout %d bytes, stderr %q", code, out.Len(), errb.String())
	}
}
