package inject

import (
	"bytes"
	"os"
	"path"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestRefuses: input that cannot be injected is an error naming the object and the reason, and nothing
// is written.
func TestRefuses(t *testing.T) {
	base, err := os.ReadFile(path.Join("testdata", "statefulset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(old, repl string) string {
		if !strings.Contains(string(base), old) {
			t.Fatalf("testdata lacks %q", old)
		}
		return strings.Replace(string(base), old, repl, 1)
	}
	const sts = "StatefulSet hostpath/csi-hostpathplugin: "
	for _, c := range []struct {
		name, in, ns string
		want         []string
	}{
		{"socket in no volume", edit("- --csi-address=/csi/csi.sock\n            - --kubelet", "- --csi-address=/elsewhere/csi.sock\n            - --kubelet"), "hostpath",
			[]string{sts, "container node-driver-registrar, --csi-address: socket /elsewhere/csi.sock is in none of the container's volumes"}},
		{"socket not on the host", edit("- hostPath:\n            path: /var/lib/kubelet/plugins/csi-hostpath\n            type: DirectoryOrCreate", "- emptyDir: {}"), "hostpath",
			[]string{sts, "not in a hostPath volume"}},
		{"registration elsewhere", edit("plugins/csi-hostpath/csi.sock", "plugins/other/csi.sock"), "hostpath",
			[]string{sts, "--kubelet-registration-path /var/lib/kubelet/plugins/other/csi.sock is not the socket --csi-address names"}},
		{"variable from a field", edit("--csi-address=/csi/csi.sock\n            - --kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock\n",
			"--csi-address=$(ADDRESS)\n            - --kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock\n"+
				"          env:\n            - name: ADDRESS\n              valueFrom: {fieldRef: {fieldPath: metadata.name}}\n"), "hostpath",
			[]string{sts, "$(ADDRESS) cannot be resolved: it comes from a field"}},
		{"socket is a volume", edit("- mountPath: /csi\n              name: socket-dir\n            - mountPath: /registration", "- mountPath: /csi/csi.sock\n              name: socket-dir\n            - mountPath: /registration"), "hostpath",
			[]string{sts, "socket /csi/csi.sock is volume socket-dir itself"}},
		{"no namespace", string(base), "", []string{"StatefulSet csi-hostpathplugin: it names no namespace"}},
		{"port taken", edit("containerPort: 9898", "containerPort: 9810"), "hostpath",
			[]string{sts, "port 9810, the proxy's, is declared by container hostpath: choose another with --node-port"}},
		{"no CSI pod", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n", "hostpath", []string{"holds no CSI driver pod"}},
		{"a list", "apiVersion: v1\nkind: List\nitems: []\n", "hostpath", []string{"document 1: a List"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := Defaults()
			o.Namespace = c.ns
			var out bytes.Buffer
			_, err := Inject(strings.NewReader(c.in), &out, o)
			if err == nil {
				t.Fatal("Inject succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if out.Len() > 0 {
				t.Errorf("wrote %d bytes", out.Len())
			}
		})
	}
}

// TestCheck: --check passes manifests whose driver pods have their proxies through unchanged, and names
// each that has none.
func TestCheck(t *testing.T) {
	in := mustRead(t, path.Join("testdata", "node-and-controller.yaml"))
	o := Defaults()
	var injected bytes.Buffer
	if _, err := Inject(bytes.NewReader(in), &injected, o); err != nil {
		t.Fatal(err)
	}
	o.Check = true
	var out bytes.Buffer
	if _, err := Inject(bytes.NewReader(injected.Bytes()), &out, o); err != nil || !bytes.Equal(out.Bytes(), injected.Bytes()) {
		t.Errorf("--check of injected manifests: %v, output equal %v", err, bytes.Equal(out.Bytes(), injected.Bytes()))
	}
	out.Reset()
	_, err := Inject(bytes.NewReader(in), &out, o)
	for _, w := range []string{"DaemonSet lvmd-system/lvmd-node: it has no crust-csi-proxy", "Deployment lvmd-system/lvmd-controller: it has no crust-csi-proxy"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("--check of plain manifests: %v, want %q", err, w)
		}
	}
	if out.Len() > 0 {
		t.Errorf("--check wrote %d bytes on error", out.Len())
	}
}

// TestRefusesOptions: options the proxies could not run with are errors naming the flag.
func TestRefusesOptions(t *testing.T) {
	for _, c := range []struct {
		set  func(*Options)
		want string
	}{
		{func(o *Options) { o.Image = "" }, "--image: empty"},
		{func(o *Options) { o.KubeletDir = "var/lib/kubelet" }, `--kubelet-dir "var/lib/kubelet": not an absolute, clean path`},
		{func(o *Options) { o.MicroVMHandlers = "kata,kata-[" }, `--microvm-handlers: pattern "kata-[" is not a path.Match pattern`},
		{func(o *Options) { o.DefaultRuntimeHandler = "Kata QEMU" }, `--default-runtime-handler "Kata QEMU": not a runtime handler name`},
		{func(o *Options) { o.NodePort = 0 }, "--node-port 0: not a port"},
		{func(o *Options) { o.ControllerPort = o.NodePort }, "--node-port and --controller-port are both 9810"},
	} {
		o := Defaults()
		c.set(&o)
		var out bytes.Buffer
		if _, err := Inject(strings.NewReader(""), &out, o); err == nil || !strings.Contains(err.Error(), c.want) || out.Len() > 0 {
			t.Errorf("%s: %v (wrote %d bytes)", c.want, err, out.Len())
		}
	}
}

func TestFlags(t *testing.T) {
	for _, c := range []struct {
		command, args []string
		want          string
		found         bool
		set           []string // args (or command) after setFlag("csi-address", "/new")
	}{
		{nil, []string{"--csi-address=/a"}, "/a", true, []string{"--csi-address=/new"}},
		{nil, []string{"-csi-address=/a"}, "/a", true, []string{"-csi-address=/new"}},
		{nil, []string{"--csi-address", "/a", "-v", "5"}, "/a", true, []string{"--csi-address", "/new", "-v", "5"}},
		{nil, []string{"-csi-address", "/a", "-csi-address=/b"}, "/b", true, []string{"-csi-address", "/a", "-csi-address=/new"}},
		{nil, []string{"--csi-address-other=/a"}, "", false, []string{"--csi-address-other=/a", "--csi-address=/new"}},
		{nil, []string{"--", "--csi-address=/a"}, "", false, []string{"--", "--csi-address=/a", "--csi-address=/new"}},
		{[]string{"/prog", "--csi-address"}, []string{"/a"}, "/a", true, []string{"/new"}},
	} {
		ctr := &corev1.Container{Command: c.command, Args: c.args}
		v, _, found := findFlag(ctr, "csi-address")
		if v != c.want || found != c.found {
			t.Errorf("%q %q: %q %v, want %q %v", c.command, c.args, v, found, c.want, c.found)
		}
		setFlag(ctr, "csi-address", "/new")
		if !reflect.DeepEqual(ctr.Args, c.set) {
			t.Errorf("%q %q set: args %q, want %q", c.command, c.args, ctr.Args, c.set)
		}
	}
}

func TestExpand(t *testing.T) {
	e := env{values: map[string]string{"A": "/a"}, unknown: map[string]string{"F": "from a field"}}
	for in, want := range map[string]string{"$(A)/s": "/a/s", "$$(A)": "$(A)", "$(B)": "$(B)", "x$": "x$", "$(A": "$(A"} {
		if got, err := e.expand(in); got != want || err != nil {
			t.Errorf("expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := e.expand("$(F)"); err == nil || !strings.Contains(err.Error(), "from a field") {
		t.Errorf("expand($(F)): %v", err)
	}
}

// TestSameAsComponent: the kustomize Component (deploy/csi-proxy) grants the proxy what the injection
// does, and names the same image.
func TestSameAsComponent(t *testing.T) {
	objs := objects(t, mustRead(t, "../../deploy/csi-proxy/rbac.yaml"))
	var role rbacv1.ClusterRole
	fromUnstructured(t, objs["ClusterRole/crust-csi-proxy"], &role)
	if !reflect.DeepEqual(role.Rules, ProxyRules) {
		t.Errorf("deploy/csi-proxy/rbac.yaml grants %v, the injection %v", role.Rules, ProxyRules)
	}
	for _, f := range []string{"sidecar.yaml", "controller.yaml"} {
		if b := mustRead(t, "../../deploy/csi-proxy/"+f); !strings.Contains(string(b), "image: "+DefaultImage+"\n") {
			t.Errorf("deploy/csi-proxy/%s does not name image %s", f, DefaultImage)
		}
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
