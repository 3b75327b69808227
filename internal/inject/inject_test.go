package inject

import (
	"bytes"
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// driverShape is one way drivers are deployed, with what the test knows of it independently of the
// injection: where each driver container listens, and the host path kubelet dialled before.
type driverShape struct {
	file      string
	namespace string // Options.Namespace
	pods      []shapePod
}

type shapePod struct {
	kind, name   string
	driver       string // the driver's container
	driverSocket vpath  // where it listens
	registration string // kubelet's registration path before (node plugins)
	controller   bool   // it holds the provisioner or resizer
	hostNetwork  bool
	account      string
}

// vpath is a path within a pod volume.
type vpath struct{ volume, rel string }

var shapes = []driverShape{
	{file: "node-and-controller.yaml", pods: []shapePod{
		{kind: "DaemonSet", name: "lvmd-node", driver: "lvmd-node", driverSocket: vpath{"node-plugin-dir", "csi-lvmd.sock"},
			registration: "/var/lib/kubelet/plugins/lvmd.example.com/node/csi-lvmd.sock", account: "lvmd-node"},
		{kind: "Deployment", name: "lvmd-controller", driver: "lvmd-controller", driverSocket: vpath{"socket-dir", "csi-lvmd.sock"},
			controller: true, account: "lvmd-controller"},
	}},
	{file: "statefulset.yaml", namespace: "hostpath", pods: []shapePod{
		{kind: "StatefulSet", name: "csi-hostpathplugin", driver: "hostpath", driverSocket: vpath{"socket-dir", "csi.sock"},
			registration: "/var/lib/kubelet/plugins/csi-hostpath/csi.sock", controller: true, account: "csi-hostpathplugin-sa"},
	}},
	{file: "native-sidecar.yaml", pods: []shapePod{
		{kind: "DaemonSet", name: "nvme-node", driver: "nvme", driverSocket: vpath{"plugins", "nvme.example.com/nvme.sock"},
			registration: "/var/lib/kubelet/plugins/nvme.example.com/nvme.sock", account: "nvme-node"},
	}},
	{file: "chart-commands.yaml", pods: []shapePod{
		{kind: "DaemonSet", name: "blockdrv-node", driver: "driver", driverSocket: vpath{"plugin-dir", "blockdrv.sock"},
			registration: "/var/lib/kubelet/plugins/blockdrv.example.com/blockdrv.sock", hostNetwork: true, account: "default"},
		{kind: "Deployment", name: "blockdrv-controller", driver: "driver", driverSocket: vpath{"socket-dir", "csi.sock"},
			controller: true, account: "blockdrv-controller"},
	}},
}

// TestShapes injects each shape and checks, per pod, what the proxy needs from the output alone.
func TestShapes(t *testing.T) {
	for _, shape := range shapes {
		t.Run(shape.file, func(t *testing.T) {
			in, err := os.ReadFile(path.Join("testdata", shape.file))
			if err != nil {
				t.Fatal(err)
			}
			o := Defaults()
			o.Namespace = shape.namespace
			var out bytes.Buffer
			res, err := Inject(bytes.NewReader(in), &out, o)
			if err != nil {
				t.Fatalf("Inject: %v", err)
			}
			if len(res.Injected) != len(shape.pods) {
				t.Errorf("injected %q, want %d pods", res.Injected, len(shape.pods))
			}
			before, after := objects(t, in), objects(t, out.Bytes())
			for _, sp := range shape.pods {
				t.Run(sp.name, func(t *testing.T) { checkPod(t, sp, shape.namespace, before, after) })
			}
			// Every object the injection does not change is kept as it was, and nothing is dropped.
			for key, obj := range before {
				if _, isPod := podKinds[obj.GetKind()]; isPod {
					continue
				}
				if !reflect.DeepEqual(after[key], obj) {
					t.Errorf("%s changed", key)
				}
			}
			// Injecting the output again changes nothing.
			var again bytes.Buffer
			res2, err := Inject(bytes.NewReader(out.Bytes()), &again, o)
			if err != nil {
				t.Fatalf("second Inject: %v", err)
			}
			if !bytes.Equal(again.Bytes(), out.Bytes()) || len(res2.Injected) != 0 || len(res2.Unchanged) != len(shape.pods) {
				t.Errorf("second Inject changed the output (injected %q, unchanged %q)", res2.Injected, res2.Unchanged)
			}
		})
	}
}

// The node proxy is told the nodes' default runtime only when it is given.
func TestDefaultRuntimeHandler(t *testing.T) {
	in, err := os.ReadFile(path.Join("testdata", shapes[0].file))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"", "crust-microvm"} {
		o := Defaults()
		o.Namespace, o.DefaultRuntimeHandler = shapes[0].namespace, h
		var out bytes.Buffer
		if _, err := Inject(bytes.NewReader(in), &out, o); err != nil {
			t.Fatal(err)
		}
		n := strings.Count(out.String(), "--default-runtime-handler")
		switch {
		case h == "" && n != 0:
			t.Errorf("without a default handler the output passes --default-runtime-handler %d times", n)
		case h != "" && (n != 1 || !strings.Contains(out.String(), "--default-runtime-handler="+h)):
			t.Errorf("with %s the output passes --default-runtime-handler %d times, want once with its value", h, n)
		}
	}
}

var podKinds = map[string]bool{"DaemonSet": true, "Deployment": true, "StatefulSet": true}

func checkPod(t *testing.T, sp shapePod, namespace string, before, after map[string]*unstructured.Unstructured) {
	key := sp.kind + "/" + sp.name
	was, now := podSpec(t, before[key]), podSpec(t, after[key])
	oldMaps, newMaps := containerMaps(before[key]), containerMaps(after[key])

	// The driver's containers, and every container that is no rewired sidecar, are as they were.
	for _, c := range append(was.Containers, was.InitContainers...) {
		r := roleOf(&c)
		if r == other {
			if !reflect.DeepEqual(newMaps[c.Name], oldMaps[c.Name]) {
				t.Errorf("container %s changed:\nwas %v\nnow %v", c.Name, oldMaps[c.Name], newMaps[c.Name])
			}
			continue
		}
		// A rewired sidecar differs in its command and args alone.
		o, n := withoutArgv(oldMaps[c.Name]), withoutArgv(newMaps[c.Name])
		if !reflect.DeepEqual(o, n) {
			t.Errorf("sidecar %s changed beyond its argv", c.Name)
		}
	}
	if now.ServiceAccountName != was.ServiceAccountName || !reflect.DeepEqual(now.AutomountServiceAccountToken, was.AutomountServiceAccountToken) {
		t.Errorf("ServiceAccount %q (automount %v), want %q (%v) as before", now.ServiceAccountName, now.AutomountServiceAccountToken, was.ServiceAccountName, was.AutomountServiceAccountToken)
	}
	// Port names are unique in a pod, or probes and scrapers by name pick one of two.
	names := map[string]string{}
	for _, c := range now.Containers {
		for _, port := range c.Ports {
			if other, ok := names[port.Name]; ok && port.Name != "" {
				t.Errorf("port name %s declared by containers %s and %s", port.Name, other, c.Name)
			}
			names[port.Name] = c.Name
		}
	}
	labels, _, _ := unstructured.NestedStringMap(after[key].Object, "spec", "template", "metadata", "labels")
	if labels[PodLabel] != PodLabelValue {
		t.Errorf("pod labels %v lack %s=%s", labels, PodLabel, PodLabelValue)
	}

	node := container(now, NodeContainer)
	if (sp.registration != "") != (node != nil) {
		t.Fatalf("node proxy present: %v, want %v", node != nil, sp.registration != "")
	}
	if node != nil {
		// kubelet's registration path is a socket the node proxy serves, beside the driver's.
		var reg *corev1.Container
		for _, c := range append(now.Containers, now.InitContainers...) {
			if roleOf(&c) == registrar {
				reg = &c
			}
		}
		regPath := flagValue(t, reg, "kubelet-registration-path")
		served := hostPathOf(t, now, node, flagValue(t, node, "csi-address"))
		if regPath != served || path.Dir(regPath) != path.Dir(sp.registration) || regPath == sp.registration {
			t.Errorf("kubelet registers %s, the proxy serves %s; want a new socket beside %s", regPath, served, sp.registration)
		}
		checkDials(t, now, node, sp)
		checkProbes(t, node, sp.hostNetwork)
		// The API token reaches the proxy, and no container that had none.
		if !slices.ContainsFunc(node.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == tokenPath }) {
			t.Errorf("the node proxy has no token mounted at %s", tokenPath)
		}
		for _, c := range now.Containers {
			if c.Name != NodeContainer && slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "crust-api-token" }) {
				t.Errorf("container %s mounts the proxy's token", c.Name)
			}
		}
		if ns := before[key].GetNamespace(); ns != "" {
			namespace = ns
		}
		checkBinding(t, after, sp.account, namespace)
	}

	ctrl := container(now, ControllerContainer)
	if sp.controller != (ctrl != nil) {
		t.Fatalf("controller proxy present: %v, want %v", ctrl != nil, sp.controller)
	}
	if ctrl != nil {
		// The provisioner and the resizer dial the controller proxy's socket; it dials the driver's.
		proxy := volumePathOf(t, ctrl, flagValue(t, ctrl, "csi-address"))
		n := 0
		for i := range now.Containers {
			c := &now.Containers[i]
			if r := roleOf(c); r == provisioner || r == resizer {
				n++
				if got := volumePathOf(t, c, flagValue(t, c, "csi-address")); got != proxy {
					t.Errorf("%s dials %v, the controller proxy serves %v", c.Name, got, proxy)
				}
			}
		}
		if n == 0 {
			t.Error("no provisioner or resizer found")
		}
		checkDials(t, now, ctrl, sp)
		checkProbes(t, ctrl, sp.hostNetwork)
		if !slices.Contains(ctrl.Args, "--controller") {
			t.Errorf("controller proxy args %q lack --controller", ctrl.Args)
		}
	}
}

// checkDials checks that proxy dials the socket the driver's container listens on.
func checkDials(t *testing.T, spec *corev1.PodSpec, proxy *corev1.Container, sp shapePod) {
	t.Helper()
	if got := volumePathOf(t, proxy, flagValue(t, proxy, "driver-address")); got != sp.driverSocket {
		t.Errorf("%s dials %v, the driver listens on %v", proxy.Name, got, sp.driverSocket)
	}
	if d := container(spec, sp.driver); d == nil {
		t.Errorf("driver container %s is gone", sp.driver)
	}
}

// checkProbes checks that the probes ask where the proxy serves HTTP.
func checkProbes(t *testing.T, c *corev1.Container, hostNetwork bool) {
	t.Helper()
	addr := flagValue(t, c, "http-addr")
	host, port, _ := strings.Cut(addr, ":")
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("%s lacks an HTTP probe", c.Name)
		}
		if p.HTTPGet.Port.String() != port {
			t.Errorf("%s probes port %s, serves %s", c.Name, p.HTTPGet.Port.String(), addr)
		}
		// Without hostNetwork the kubelet probes the pod's IP: the proxy must listen on every address
		// of the pod; on the host network it keeps to the node's loopback, which the probe must name.
		switch {
		case hostNetwork && (host != "127.0.0.1" || p.HTTPGet.Host != "127.0.0.1"):
			t.Errorf("%s on the host network serves %s and probes host %q", c.Name, addr, p.HTTPGet.Host)
		case !hostNetwork && (host != "" || p.HTTPGet.Host != ""):
			t.Errorf("%s off the host network serves %s and probes host %q", c.Name, addr, p.HTTPGet.Host)
		}
	}
}

// checkBinding checks that the pod's own account is allowed what the proxy needs.
func checkBinding(t *testing.T, objs map[string]*unstructured.Unstructured, account, namespace string) {
	t.Helper()
	var bound, granted bool
	for _, obj := range objs {
		switch obj.GetKind() {
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			fromUnstructured(t, obj, &b)
			if b.RoleRef.Name == RoleName(namespace, account) && slices.Contains(b.Subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: account, Namespace: namespace}) {
				bound = true
			}
		case "ClusterRole":
			var r rbacv1.ClusterRole
			fromUnstructured(t, obj, &r)
			granted = granted || (r.Name == RoleName(namespace, account) && reflect.DeepEqual(r.Rules, ProxyRules))
		}
	}
	if !bound || !granted {
		t.Errorf("account %s/%s: bound %v, role with the proxy's rules %v", namespace, account, bound, granted)
	}
}

// flagValue reads a flag the way the program would, $(VAR) resolved from literal env values.
func flagValue(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	v, _, ok := findFlag(c, name)
	if !ok {
		t.Fatalf("container %s has no --%s in %q %q", c.Name, name, c.Command, c.Args)
	}
	for _, e := range c.Env {
		v = strings.ReplaceAll(v, "$("+e.Name+")", e.Value)
	}
	return strings.TrimPrefix(v, "unix://")
}

// volumePathOf places a path c names in the volume c mounts there (the containers it is asked about
// mount whole volumes).
func volumePathOf(t *testing.T, c *corev1.Container, p string) vpath {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if rel, ok := strings.CutPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/"); ok {
			return vpath{m.Name, rel}
		}
	}
	t.Fatalf("%s names %s, in none of its volumes", c.Name, p)
	return vpath{}
}

func hostPathOf(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, p string) string {
	t.Helper()
	vp := volumePathOf(t, c, p)
	for _, v := range spec.Volumes {
		if v.Name == vp.volume && v.HostPath != nil {
			return path.Join(v.HostPath.Path, vp.rel)
		}
	}
	t.Fatalf("%s: volume %s is not a hostPath", c.Name, vp.volume)
	return ""
}

func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func withoutArgv(m map[string]any) map[string]any {
	c := map[string]any{}
	for k, v := range m {
		if k != "command" && k != "args" {
			c[k] = v
		}
	}
	return c
}

// objects parses a stream into its objects by kind and name.
func objects(t *testing.T, stream []byte) map[string]*unstructured.Unstructured {
	t.Helper()
	docs, err := readDocs(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*unstructured.Unstructured{}
	for _, d := range docs {
		m[d.obj.GetKind()+"/"+d.obj.GetName()] = d.obj
	}
	return m
}

func podSpec(t *testing.T, obj *unstructured.Unstructured) *corev1.PodSpec {
	t.Helper()
	if obj == nil {
		t.Fatal("object missing from the output")
	}
	m, _, _ := unstructured.NestedMap(obj.Object, "spec", "template", "spec")
	var spec corev1.PodSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &spec); err != nil {
		t.Fatal(err)
	}
	return &spec
}

// containerMaps are the maps of the containers and init containers, by name.
func containerMaps(obj *unstructured.Unstructured) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, list := range []string{"containers", "initContainers"} {
		l, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", list)
		for _, c := range l {
			m := c.(map[string]any)
			out[m["name"].(string)] = m
		}
	}
	return out
}

func fromUnstructured(t *testing.T, obj *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
		t.Fatal(err)
	}
}

// A CSIDriver object in the input without podInfoOnMount: true gets it, and the result names it; one
// that has it is left as it was. With --check nothing is changed, and such a CSIDriver fails the check
// by name.
func TestCSIDriverPodInfo(t *testing.T) {
	drivers := "---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: lvmd.example.com\nspec:\n  attachRequired: false\n" +
		"---\napiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n  name: other.example.com\nspec:\n  podInfoOnMount: true\n"
	in, err := os.ReadFile("testdata/node-and-controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := Inject(strings.NewReader(string(in)+drivers), &out, Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.PodInfoSet, []string{"CSIDriver lvmd.example.com"}) {
		t.Errorf("PodInfoSet = %v; want the CSIDriver without podInfoOnMount alone", res.PodInfoSet)
	}
	output := out.String()
	docs, err := readDocs(strings.NewReader(output))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, d := range docs {
		if d.obj == nil || d.obj.GetKind() != "CSIDriver" {
			continue
		}
		seen++
		if on, _, _ := unstructured.NestedBool(d.obj.Object, "spec", "podInfoOnMount"); !on {
			t.Errorf("CSIDriver %s in the output: podInfoOnMount not true", d.obj.GetName())
		}
		if d.obj.GetName() == "lvmd.example.com" {
			if a, _, _ := unstructured.NestedBool(d.obj.Object, "spec", "attachRequired"); a {
				t.Errorf("CSIDriver %s lost its other fields", d.obj.GetName())
			}
		}
	}
	if seen != 2 {
		t.Fatalf("%d CSIDrivers in the output, want 2", seen)
	}

	check := Defaults()
	check.Check = true
	injected := strings.Replace(output, "podInfoOnMount: true", "podInfoOnMount: false", 1)
	var none bytes.Buffer
	if _, err := Inject(strings.NewReader(injected), &none, check); err == nil ||
		!strings.Contains(err.Error(), "CSIDriver lvmd.example.com: podInfoOnMount is not true") || none.Len() != 0 {
		t.Errorf("--check of a CSIDriver without podInfoOnMount: %v (wrote %d bytes); want it named, nothing written", err, none.Len())
	}
	if _, err := Inject(strings.NewReader(output), &none, check); err != nil {
		t.Errorf("--check of the injected output: %v", err)
	}
}
