// Package inject adds crust-csi-proxy to a CSI driver's manifests as the driver's own project renders
// them, with no change to the driver. `kubectl crust inject` and the Helm post-renderers run it; its Check
// mode verifies a build that got the proxy from the kustomize Component.
//
// Promises:
//   - It finds the node plugin by its node-driver-registrar container and the controller by its
//     external-provisioner or external-resizer containers, in DaemonSets, Deployments, StatefulSets,
//     ReplicaSets and Pods, and in a pod that holds both. A sidecar is known by its image or by its
//     command, whichever names it, among the pod's containers and its native sidecars (init containers
//     that restart always).
//   - It reads the sidecars' flags in every form a Go program accepts, resolves $(VAR) from the
//     container's env and the ConfigMaps of the input, and places each socket through the container's
//     volumeMounts and the pod's volumes, whatever the socket's name.
//   - kubelet (the registrar's --kubelet-registration-path) and the controller sidecars (their
//     --csi-address) are pointed at proxies that serve new sockets beside the driver's; the proxies dial the
//     driver's own socket. The driver's containers are left as they were, and so is every object it does
//     not change.
//   - The pod keeps its ServiceAccount; crust's ClusterRole is made for it and bound to it. Only the node
//     proxy is given the account's token explicitly; no container gets one it did not have.
//   - Probes reach the proxy with and without hostNetwork.
//   - Input that cannot be injected (a socket it cannot place, a port taken, no CSI pod at all) is refused
//     with errors naming each object and the reason, and nothing is written.
//   - Injecting its own output again changes nothing; with Options.Check, a driver pod without its
//     proxies is an error instead.
package inject

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Options are what the injection needs that the driver's manifests do not say.
type Options struct {
	// Namespace is given to objects that name none (a chart's release namespace); "" refuses such a
	// driver pod, as its ServiceAccount's namespace could not be named.
	Namespace string
	// Image is crust-csi-proxy's image.
	Image string
	// KubeletDir is kubelet's root directory on the nodes (--root-dir).
	KubeletDir string
	// MicroVMHandlers are the RuntimeClass handler patterns whose pods get deferred volumes, as
	// crust-csi-proxy's --microvm-handlers takes them.
	MicroVMHandlers string
	// DefaultRuntimeHandler is the nodes' containerd default runtime, as crust-csi-proxy's
	// --default-runtime-handler takes it; "" (runc) passes no flag.
	DefaultRuntimeHandler string
	// NodePort and ControllerPort are the proxies' HTTP ports (/metrics, /healthz, /readyz).
	NodePort, ControllerPort int32
	// Check changes nothing: a driver pod without its proxies is an error, and input whose every driver
	// pod has them is written as it came. For manifests given the proxy another way (the kustomize
	// Component), whose mistakes would otherwise pass silently.
	Check bool
}

// Defaults returns the options of an install as deploy/ makes it.
func Defaults() Options {
	return Options{
		Image:           DefaultImage,
		KubeletDir:      "/var/lib/kubelet",
		MicroVMHandlers: "kata,kata-*,crust-microvm",
		NodePort:        9810,
		ControllerPort:  9812,
	}
}

// handlerName is what a RuntimeClass's handler may be: a DNS label.
var handlerName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// check refuses options the proxies could not run with, naming the flag.
func (o Options) check() error {
	var errs []error
	if o.Image == "" {
		errs = append(errs, errors.New("--image: empty"))
	}
	if !path.IsAbs(o.KubeletDir) || path.Clean(o.KubeletDir) != o.KubeletDir {
		errs = append(errs, fmt.Errorf("--kubelet-dir %q: not an absolute, clean path", o.KubeletDir))
	}
	for _, p := range strings.Split(o.MicroVMHandlers, ",") {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			errs = append(errs, fmt.Errorf("--microvm-handlers: pattern %q is not a path.Match pattern", p))
		}
	}
	if h := o.DefaultRuntimeHandler; h != "" && !handlerName.MatchString(h) {
		errs = append(errs, fmt.Errorf("--default-runtime-handler %q: not a runtime handler name (a DNS label, as a RuntimeClass's handler)", h))
	}
	for _, p := range []struct {
		flag string
		n    int32
	}{{"--node-port", o.NodePort}, {"--controller-port", o.ControllerPort}} {
		if p.n < 1 || p.n > 65535 {
			errs = append(errs, fmt.Errorf("%s %d: not a port", p.flag, p.n))
		}
	}
	if o.NodePort == o.ControllerPort {
		errs = append(errs, fmt.Errorf("--node-port and --controller-port are both %d: a pod may hold both proxies", o.NodePort))
	}
	return errors.Join(errs...)
}

// DefaultImage is the proxy's image as deploy/csi-proxy names it.
const DefaultImage = "crust/crust-csi-proxy:v0.2.0-dev"

// Names of what the injection adds. The proxies' containers are how it knows a pod it injected before.
const (
	NodeContainer       = "crust-csi-proxy"
	ControllerContainer = "crust-csi-proxy-controller"
	// NodeSocket and ControllerSocket are the proxies' sockets, in the directory of the driver's.
	NodeSocket       = "crust-node.sock"
	ControllerSocket = "crust-controller.sock"
	// PodLabel marks the pods that carry a proxy (the proxy's PodMonitor selects them).
	PodLabel      = "crust.dev/csi-proxy"
	PodLabelValue = "injected"
	// NodePortName and ControllerPortName name the proxies' HTTP ports (/metrics, /healthz, /readyz):
	// two names, as port names are unique in a pod and a pod may hold both proxies.
	NodePortName       = "crust-node"
	ControllerPortName = "crust-ctrl"
	// pluginMount is where a proxy mounts the pod volume that holds the driver's socket.
	pluginMount = "/crust/plugin"
	tokenPath   = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// Result says what Inject did.
type Result struct {
	// Injected names each pod given a proxy, with where kubelet or the sidecars now dial.
	Injected []string
	// Unchanged names each pod that had its proxies already.
	Unchanged []string
	// PodInfoSet names each CSIDriver object given podInfoOnMount: true.
	PodInfoSet []string
}

// Inject reads a stream of manifests (YAML or JSON documents, as `helm template` or `kustomize build`
// write them) from r and writes them to w with crust added. On error it writes nothing.
func Inject(r io.Reader, w io.Writer, o Options) (Result, error) {
	if err := o.check(); err != nil {
		return Result{}, err
	}
	docs, err := readDocs(r)
	if err != nil {
		return Result{}, err
	}
	configMaps := map[string]map[string]string{}
	for _, d := range docs {
		if d.obj != nil && d.obj.GetKind() == "ConfigMap" && d.obj.GetAPIVersion() == "v1" {
			data, _, _ := unstructured.NestedStringMap(d.obj.Object, "data")
			configMaps[namespaceOf(d.obj, o)+"/"+d.obj.GetName()] = data
		}
	}
	var res Result
	var errs []error
	accounts := map[string]bool{} // namespace/name of the accounts that need crust's role
	var rbac []*unstructured.Unstructured
	for _, d := range docs {
		p, err := podOf(d.obj, o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p == nil {
			continue
		}
		done, err := p.inject(o, configMaps)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", p.id, err))
		case done == "":
		case done == "unchanged":
			res.Unchanged = append(res.Unchanged, p.id)
		case o.Check:
			errs = append(errs, fmt.Errorf("%s: it has no crust-csi-proxy (with the kustomize Component: the label crust.dev/csi-proxy: enabled is missing from it, or was added after the Component ran)", p.id))
		default:
			d.changed = true
			res.Injected = append(res.Injected, p.id+": "+done)
			if p.nodeProxy {
				key := p.namespace + "/" + p.serviceAccount()
				if !accounts[key] {
					accounts[key] = true
					rbac = append(rbac, clusterRole(p.namespace, p.serviceAccount()), clusterRoleBinding(p.namespace, p.serviceAccount()))
				}
			}
		}
	}
	for _, d := range docs {
		set, err := podInfoOnMount(d, o)
		if err != nil {
			errs = append(errs, err)
		} else if set != "" {
			res.PodInfoSet = append(res.PodInfoSet, set)
		}
	}
	if len(errs) == 0 && len(res.Injected)+len(res.Unchanged) == 0 {
		errs = append(errs, errors.New("the input holds no CSI driver pod: no container runs node-driver-registrar, external-provisioner or external-resizer"))
	}
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	var out bytes.Buffer
	for i, d := range docs {
		if i > 0 {
			out.WriteString("---\n")
		}
		if !d.changed {
			out.Write(d.raw)
			continue
		}
		b, err := yaml.Marshal(d.obj.Object)
		if err != nil {
			return Result{}, err
		}
		out.Write(b)
	}
	for _, obj := range rbac {
		// One ClusterRole and binding an account, named after it: no other driver's or release's is replaced.
		b, err := yaml.Marshal(obj.Object)
		if err != nil {
			return Result{}, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	_, err = w.Write(out.Bytes())
	return res, err
}

// podInfoOnMount gives the CSIDriver object d holds podInfoOnMount: true, which the node proxy needs (it
// decides per pod, and kubelet names the pod in a publish only with it), and returns its name; with
// o.Check it changes nothing and fails naming the object instead. It returns "" for anything else, and
// for a CSIDriver that has it.
func podInfoOnMount(d *doc, o Options) (string, error) {
	if d.obj == nil || d.obj.GetKind() != "CSIDriver" || !strings.HasPrefix(d.obj.GetAPIVersion(), "storage.k8s.io/") {
		return "", nil
	}
	if on, _, _ := unstructured.NestedBool(d.obj.Object, "spec", "podInfoOnMount"); on {
		return "", nil
	}
	name := "CSIDriver " + d.obj.GetName()
	if o.Check {
		return "", fmt.Errorf("%s: podInfoOnMount is not true: kubelet then names no pod in a publish, and crust-csi-proxy "+
			"refuses to defer a volume without knowing the pod's runtime; set spec.podInfoOnMount: true", name)
	}
	if err := unstructured.SetNestedField(d.obj.Object, true, "spec", "podInfoOnMount"); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	d.changed = true
	return name, nil
}

// doc is one document of the input: its text, and the object it holds.
type doc struct {
	raw     []byte
	obj     *unstructured.Unstructured
	changed bool
}

func readDocs(r io.Reader) ([]*doc, error) {
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []*doc
	for n := 1; ; n++ {
		raw, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading document %d: %w", n, err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if t := bytes.TrimSpace(js); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue // only comments, or nothing
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if obj.IsList() {
			return nil, fmt.Errorf("document %d: a %s: give its items as documents of their own", n, obj.GetKind())
		}
		raw = bytes.TrimRight(raw, "\n")
		docs = append(docs, &doc{raw: append(raw, '\n'), obj: obj})
	}
}

func namespaceOf(obj *unstructured.Unstructured, o Options) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns
	}
	return o.Namespace
}

// pod is the pod template of a workload (or a Pod itself): a typed copy to read, and the object's own
// map to change.
type pod struct {
	id        string // Kind namespace/name, for messages
	namespace string
	tmpl      map[string]any
	spec      corev1.PodSpec
	nodeProxy bool // it was given a node proxy, which needs crust's role
}

// podOf returns obj's pod template, or nil when obj is not a workload.
func podOf(obj *unstructured.Unstructured, o Options) (*pod, error) {
	if obj == nil {
		return nil, nil
	}
	gv, kind := obj.GetAPIVersion(), obj.GetKind()
	var tmpl map[string]any
	switch {
	case gv == "v1" && kind == "Pod":
		tmpl = obj.Object
	case gv == "apps/v1" && slices.Contains([]string{"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet"}, kind):
		spec, _ := obj.Object["spec"].(map[string]any)
		tmpl, _ = spec["template"].(map[string]any)
		if tmpl == nil {
			return nil, nil
		}
	default:
		return nil, nil
	}
	p := &pod{namespace: namespaceOf(obj, o), tmpl: tmpl}
	p.id = kind + " " + obj.GetName()
	if p.namespace != "" {
		p.id = kind + " " + p.namespace + "/" + obj.GetName()
	}
	spec, _ := tmpl["spec"].(map[string]any)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &p.spec); err != nil {
		return nil, fmt.Errorf("%s: its pod spec: %w", p.id, err)
	}
	return p, nil
}

func (p *pod) serviceAccount() string {
	switch {
	case p.spec.ServiceAccountName != "":
		return p.spec.ServiceAccountName
	case p.spec.DeprecatedServiceAccount != "":
		return p.spec.DeprecatedServiceAccount
	}
	return "default"
}

// role is what a sidecar does for the driver.
type role int

const (
	other role = iota
	registrar
	provisioner
	resizer
)

// sidecarNames are the names a sidecar's image or command go by.
var sidecarNames = map[string]role{
	"csi-node-driver-registrar": registrar,
	"node-driver-registrar":     registrar,
	"csi-provisioner":           provisioner,
	"external-provisioner":      provisioner,
	"csi-resizer":               resizer,
	"external-resizer":          resizer,
}

// roleOf knows a sidecar by its image's name (without registry, tag or digest) or by its command's
// program name, for drivers that ship every sidecar in one image.
func roleOf(c *corev1.Container) role {
	image := c.Image
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndexByte(image, ':'); i > strings.LastIndexByte(image, '/') {
		image = image[:i]
	}
	if r := sidecarNames[path.Base(image)]; r != other {
		return r
	}
	if len(c.Command) > 0 {
		return sidecarNames[path.Base(c.Command[0])]
	}
	return other
}

// placed is a socket as one container names it, placed in the pod's volumes.
type placed struct {
	volume string
	rel    string // below the volume's root (the mount's subPath included)
}

func (s placed) String() string { return "volume " + s.volume + ", " + s.rel }

// place finds the volume that holds the socket c names with its flag (def when the flag is absent).
func (p *pod) place(c *corev1.Container, flag, def string, cms map[string]map[string]string) (placed, error) {
	addr, _, found := findFlag(c, flag)
	if !found {
		addr = def
	}
	addr, err := containerEnv(c, cms, p.namespace).expand(addr)
	if err != nil {
		return placed{}, fmt.Errorf("container %s, --%s: %w", c.Name, flag, err)
	}
	sock, err := socketPath(addr)
	if err != nil {
		return placed{}, fmt.Errorf("container %s, --%s: %w", c.Name, flag, err)
	}
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		mp := path.Clean(m.MountPath)
		if (sock == mp || strings.HasPrefix(sock, strings.TrimSuffix(mp, "/")+"/")) && (best == nil || len(mp) > len(path.Clean(best.MountPath))) {
			best = &c.VolumeMounts[i]
		}
	}
	if best == nil {
		return placed{}, fmt.Errorf("container %s, --%s: socket %s is in none of the container's volumes", c.Name, flag, sock)
	}
	if best.SubPathExpr != "" {
		return placed{}, fmt.Errorf("container %s, --%s: socket %s is in volume %s mounted with subPathExpr, which is known only on the node", c.Name, flag, sock, best.Name)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(sock, path.Clean(best.MountPath)), "/")
	if rel == "" {
		return placed{}, fmt.Errorf("container %s, --%s: socket %s is volume %s itself, not a file in a directory the proxy's socket could sit beside", c.Name, flag, sock, best.Name)
	}
	return placed{volume: best.Name, rel: path.Join(best.SubPath, rel)}, nil
}

// hostPath is the socket's path on the node, when its volume is a hostPath.
func (p *pod) hostPath(s placed) (string, bool) {
	for _, v := range p.spec.Volumes {
		if v.Name == s.volume && v.HostPath != nil {
			return path.Join(v.HostPath.Path, s.rel), true
		}
	}
	return "", false
}

// inject adds the proxies p's pod needs. It returns what it did ("" when p is no CSI driver pod,
// "unchanged" when it has its proxies already).
func (p *pod) inject(o Options, cms map[string]map[string]string) (string, error) {
	var regs, ctrls []sidecar
	for _, sc := range p.sidecars() {
		if sc.Name == NodeContainer || sc.Name == ControllerContainer {
			return "unchanged", nil
		}
		switch roleOf(sc.Container) {
		case registrar:
			regs = append(regs, sc)
		case provisioner, resizer:
			ctrls = append(ctrls, sc)
		}
	}
	if len(regs)+len(ctrls) == 0 {
		return "", nil
	}
	if p.namespace == "" {
		return "", errors.New("it names no namespace, and none was given (--namespace): its ServiceAccount's namespace must be known")
	}
	if len(regs) > 1 {
		return "", fmt.Errorf("containers %s and %s both run node-driver-registrar: one driver a pod", regs[0].Name, regs[1].Name)
	}
	if err := p.checkPorts(o); err != nil {
		return "", err
	}
	var added []corev1.Container
	var did []string
	if len(regs) == 1 {
		c, what, err := p.node(regs[0].Container, o, cms)
		if err != nil {
			return "", err
		}
		added, did = append(added, c), append(did, what)
		p.nodeProxy = true
	}
	if len(ctrls) > 0 {
		c, what, err := p.controller(ctrls, o, cms)
		if err != nil {
			return "", err
		}
		added, did = append(added, c), append(did, what)
	}
	if err := p.apply(added, append(regs, ctrls...), o); err != nil {
		return "", err
	}
	return strings.Join(did, "; "), nil
}

// sidecar is a container that may be one of the driver's sidecars: one of the pod's containers, or a
// native sidecar (an init container that restarts always and runs beside them).
type sidecar struct {
	*corev1.Container
	list  string // "containers" or "initContainers"
	index int
}

func (p *pod) sidecars() []sidecar {
	var out []sidecar
	for i := range p.spec.Containers {
		out = append(out, sidecar{&p.spec.Containers[i], "containers", i})
	}
	for i := range p.spec.InitContainers {
		c := &p.spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			out = append(out, sidecar{c, "initContainers", i})
		}
	}
	return out
}

// checkPorts refuses proxy ports that a container of the pod declares already.
func (p *pod) checkPorts(o Options) error {
	for _, sc := range p.sidecars() {
		c := sc.Container
		for _, port := range c.Ports {
			for _, ours := range []struct {
				n    int32
				flag string
			}{{o.NodePort, "--node-port"}, {o.ControllerPort, "--controller-port"}} {
				if port.ContainerPort == ours.n {
					return fmt.Errorf("port %d, the proxy's, is declared by container %s: choose another with %s", ours.n, c.Name, ours.flag)
				}
			}
		}
	}
	return nil
}

// node wires kubelet to a node proxy: the registrar's registration path moves to the proxy's socket,
// beside the driver's, and the proxy dials the driver's socket, found through the registrar's
// --csi-address.
func (p *pod) node(reg *corev1.Container, o Options, cms map[string]map[string]string) (corev1.Container, string, error) {
	sock, err := p.place(reg, "csi-address", "/run/csi/socket", cms)
	if err != nil {
		return corev1.Container{}, "", err
	}
	host, ok := p.hostPath(sock)
	if !ok {
		return corev1.Container{}, "", fmt.Errorf("container %s: the driver's socket (%s) is not in a hostPath volume, so kubelet could not reach a proxy beside it", reg.Name, sock)
	}
	regPath, _, found := findFlag(reg, "kubelet-registration-path")
	if !found {
		return corev1.Container{}, "", fmt.Errorf("container %s: node-driver-registrar has no --kubelet-registration-path", reg.Name)
	}
	if regPath, err = containerEnv(reg, cms, p.namespace).expand(regPath); err != nil {
		return corev1.Container{}, "", fmt.Errorf("container %s, --kubelet-registration-path: %w", reg.Name, err)
	}
	if path.Clean(regPath) != host {
		return corev1.Container{}, "", fmt.Errorf("container %s: --kubelet-registration-path %s is not the socket --csi-address names (%s on the node): kubelet would dial another socket than the registrar's", reg.Name, regPath, host)
	}
	proxySock := path.Join(path.Dir(host), NodeSocket)
	setFlag(reg, "kubelet-registration-path", proxySock)

	c := p.proxyContainer(NodeContainer, NodePortName, o.NodePort, sock, NodeSocket, o)
	c.Args = append(c.Args,
		"--crust-socket=/run/crust/crust.sock",
		"--microvm-handlers="+o.MicroVMHandlers,
		"--kubeconfig=in-cluster",
		"--state-dir="+path.Join(o.KubeletDir, "plugins/crust.dev/csi-proxy", p.namespace+"."+p.stateName()),
	)
	if o.DefaultRuntimeHandler != "" {
		c.Args = append(c.Args, "--default-runtime-handler="+o.DefaultRuntimeHandler)
	}
	c.Env = []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
	c.Resources = resources("32Mi", "128Mi")
	privileged, root := true, int64(0)
	c.SecurityContext = &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root}
	bidi, h2c := corev1.MountPropagationBidirectional, corev1.MountPropagationHostToContainer
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: "crust-kubelet-dir", MountPath: o.KubeletDir, MountPropagation: &bidi},
		corev1.VolumeMount{Name: "crust-socket-dir", MountPath: "/run/crust"},
		corev1.VolumeMount{Name: "crust-dev", MountPath: "/dev", MountPropagation: &h2c},
		corev1.VolumeMount{Name: "crust-api-token", MountPath: tokenPath, ReadOnly: true},
	)
	return c, "kubelet dials " + proxySock + ", the proxy " + host, nil
}

// stateName tells this driver's proxy records from another driver's on the same node.
func (p *pod) stateName() string {
	_, name, _ := strings.Cut(p.id, "/")
	return name
}

// controller wires the provisioner and resizer to a controller proxy that dials the socket they dialled.
func (p *pod) controller(ctrls []sidecar, o Options, cms map[string]map[string]string) (corev1.Container, string, error) {
	var sock placed
	for n, sc := range ctrls {
		c := sc.Container
		s, err := p.place(c, "csi-address", "/run/csi/socket", cms)
		if err != nil {
			return corev1.Container{}, "", err
		}
		if n > 0 && s != sock {
			return corev1.Container{}, "", fmt.Errorf("containers %s and %s dial different sockets (%s; %s): one controller a pod", ctrls[0].Name, c.Name, sock, s)
		}
		sock = s
	}
	var names []string
	for _, sc := range ctrls {
		c := sc.Container
		for _, m := range c.VolumeMounts {
			if m.Name == sock.volume {
				// The proxy's socket as this sidecar sees it: beside the driver's, through the same mount.
				dir := strings.TrimPrefix(path.Dir(sock.rel), m.SubPath)
				setFlag(c, "csi-address", path.Join(m.MountPath, dir, ControllerSocket))
				break
			}
		}
		names = append(names, c.Name)
	}
	c := p.proxyContainer(ControllerContainer, ControllerPortName, o.ControllerPort, sock, ControllerSocket, o)
	c.Args = slices.Insert(c.Args, 0, "--controller")
	c.Resources = resources("16Mi", "64Mi")
	no, ro := false, true
	c.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &ro,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	return c, strings.Join(names, " and ") + " dial " + path.Join(path.Dir(sock.rel), ControllerSocket) + " in " + sock.volume + ", the proxy " + sock.rel, nil
}

// proxyContainer is what both proxies share: the image, the sockets, HTTP and probes.
func (p *pod) proxyContainer(name, portName string, port int32, sock placed, own string, o Options) corev1.Container {
	// On the host network the proxy keeps its HTTP endpoints to the node's loopback; otherwise it serves
	// them on the pod's IP, where the kubelet's probes and a scraper reach them.
	addr, host := fmt.Sprintf(":%d", port), ""
	if p.spec.HostNetwork {
		addr, host = fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1"
	}
	probe := func(path string, period int32) *corev1.Probe {
		return &corev1.Probe{PeriodSeconds: period, FailureThreshold: 3, ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Host: host, Path: path, Port: intstr.FromInt32(port)}}}
	}
	return corev1.Container{
		Name:            name,
		Image:           o.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{
			"--csi-address=" + path.Join(pluginMount, path.Dir(sock.rel), own),
			"--driver-address=" + path.Join(pluginMount, sock.rel),
			"--http-addr=" + addr,
			"--log-format=json",
		},
		Ports:          []corev1.ContainerPort{{Name: portName, ContainerPort: port, Protocol: corev1.ProtocolTCP}},
		LivenessProbe:  probe("/healthz", 10),
		ReadinessProbe: probe("/readyz", 5),
		VolumeMounts:   []corev1.VolumeMount{{Name: sock.volume, MountPath: pluginMount}},
	}
}

// apply writes the changed sidecars' argv, the proxies, their volumes and the pod label into the
// object's own map, leaving every other container's map as it was.
func (p *pod) apply(added []corev1.Container, changed []sidecar, o Options) error {
	spec := p.tmpl["spec"].(map[string]any)
	for _, sc := range changed {
		c := spec[sc.list].([]any)[sc.index].(map[string]any)
		for key, words := range map[string][]string{"command": sc.Command, "args": sc.Args} {
			if len(words) > 0 {
				c[key] = toAny(words)
			}
		}
	}
	containers, _ := spec["containers"].([]any)
	for _, c := range added {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
		if err != nil {
			return err
		}
		containers = append(containers, m)
	}
	spec["containers"] = containers

	var vols []corev1.Volume
	if p.nodeProxy {
		dir, orCreate, isDir := corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate, corev1.HostPathDirectory
		expiry := int64(3607)
		vols = []corev1.Volume{
			{Name: "crust-kubelet-dir", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: o.KubeletDir, Type: &dir}}},
			{Name: "crust-socket-dir", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/crust", Type: &orCreate}}},
			{Name: "crust-dev", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev", Type: &isDir}}},
			{Name: "crust-api-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
					Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
			}}}},
		}
	}
	volumes, _ := spec["volumes"].([]any)
	for _, v := range vols {
		for _, have := range p.spec.Volumes {
			if have.Name == v.Name {
				return fmt.Errorf("it has a volume named %s already, the name the proxy's takes", v.Name)
			}
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&v)
		if err != nil {
			return err
		}
		volumes = append(volumes, m)
	}
	if len(volumes) > 0 {
		spec["volumes"] = volumes
	}
	meta, _ := p.tmpl["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		p.tmpl["metadata"] = meta
	}
	labels, _ := meta["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
	}
	labels[PodLabel] = PodLabelValue
	meta["labels"] = labels
	return nil
}

func toAny(words []string) []any {
	out := make([]any, len(words))
	for i, w := range words {
		out[i] = w
	}
	return out
}

// resources are a proxy's: a small CPU request and no CPU limit, as deploy/csi-proxy's.
func resources(request, limit string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse(request)},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)},
	}
}
