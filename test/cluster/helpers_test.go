package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/testutil/harness"
)

const (
	// deferClass is deploy/examples' StorageClass that defers.
	deferClass = "crust-lvm-defer"
	// microVMClass is deploy/examples' RuntimeClass of the microVM handler.
	microVMClass = "crust-microvm"
	// driverName is the example driver's name.
	driverName = "lvm.test.crust.dev"
	// image is the test image: busybox with a shell.
	image = "localhost/busybox:latest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// begin is how a test of the tier starts: it returns the cluster (get), a context that ends at cleanup
// or after 5 minutes (ctxT), and a namespace of the test's own (namespace).
func begin(t *testing.T) (*cluster, context.Context, string) {
	t.Helper()
	c := get(t)
	return c, ctxT(t), c.namespace(t)
}

// waitFor polls ok (harness.Poll) until it holds, failing t after timeout; an error from ok is the
// reason it does not hold yet.
func waitFor(t *testing.T, timeout time.Duration, what string, ok func() (bool, error)) {
	t.Helper()
	ctx, cancel := harness.Context(t, timeout)
	defer cancel()
	if err := harness.Poll(ctx, ok); err != nil {
		t.Fatalf("waited %s for %s: %v", timeout, what, err)
	}
}

// namespace makes a namespace for one test and deletes it (waiting until it is gone) at cleanup.
func (c *cluster) namespace(t *testing.T) string {
	t.Helper()
	ctx := ctxT(t)
	name := fmt.Sprintf("t-%s-%d", strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())), time.Now().UnixNano()%100000)
	if len(name) > 60 {
		name = name[:60]
	}
	name = strings.TrimRight(name, "-")
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the default ServiceAccount of "+name, func() (bool, error) {
		_, err := c.cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_ = c.cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
		if err := harness.Poll(ctx, func() (bool, error) {
			_, err := c.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		}); err != nil {
			t.Errorf("namespace %s not gone after 3 minutes: %v", name, err)
		}
	})
	return name
}

// pvc makes a PersistentVolumeClaim of the deferring class.
func (c *cluster) pvc(t *testing.T, ns, name, size string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return c.pvcOfMode(t, ns, name, size, nil)
}

// pvcOfMode is pvc with a volume mode (nil: the default, Filesystem).
func (c *cluster) pvcOfMode(t *testing.T, ns, name, size string, mode *corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	t.Helper()
	return c.pvcOfClass(t, ns, name, size, deferClass, mode)
}

// pvcOfClass is pvcOfMode in another StorageClass.
func (c *cluster) pvcOfClass(t *testing.T, ns, name, size, class string, mode *corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	t.Helper()
	p, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Create(ctxT(t), claimOf(name, size, class, mode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// claimOf is a ReadWriteOnce PersistentVolumeClaim of class and mode (nil: Filesystem), as pvcOfClass
// creates it or a StatefulSet's volumeClaimTemplates holds it.
func claimOf(name, size, class string, mode *corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeMode:       mode,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
}

// podSpec is a pod that logs its kernel and sleeps in busybox, with volumes mounted at /<volume name>, of
// runtimeClass ("" for the node's default runtime, the microVM's).
func podSpec(name, runtimeClass string, fsGroup *int64, vols ...corev1.Volume) *corev1.Pod {
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			SecurityContext:               &corev1.PodSecurityContext{FSGroup: fsGroup},
			Containers: []corev1.Container{{
				Name: "c", Image: image, ImagePullPolicy: corev1.PullNever,
				// The kernel it runs on goes to its log first (kubectl logs): a microVM pod's is the guest's.
				Command: []string{"sh", "-c", "trap 'exit 0' TERM; echo kernel $(uname -r); sleep 3600 & wait"},
			}},
			Volumes: vols,
		},
	}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	for _, v := range vols {
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	return p
}

func claimVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

// createPod creates the pod without waiting for it, and returns it as created.
func (c *cluster) createPod(t *testing.T, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	p, err := c.cs.CoreV1().Pods(ns).Create(ctxT(t), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// runPod creates the pod and waits until it runs.
func (c *cluster) runPod(t *testing.T, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := ctxT(t)
	p = c.createPod(t, ns, p)
	c.waitRunning(t, ns, p.Name)
	p, err := c.cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *cluster) waitRunning(t *testing.T, ns, name string) {
	t.Helper()
	ctx := ctxT(t)
	waitFor(t, 3*time.Minute, "pod "+ns+"/"+name+" Running", func() (bool, error) {
		p, err := c.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			t.Fatalf("pod %s/%s ended: %s\n%s", ns, name, p.Status.Phase, c.events(ns, name))
		}
		return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s; %s", p.Status.Phase, c.events(ns, name))
	})
}

// deletePod deletes a pod and waits until it is gone.
func (c *cluster) deletePod(t *testing.T, ns, name string) {
	t.Helper()
	ctx := ctxT(t)
	if err := c.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "pod "+ns+"/"+name+" gone", func() (bool, error) {
		_, err := c.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// events is the events of an object, one a line, for failure messages.
func (c *cluster) events(ns, name string) string {
	ev, err := c.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range ev.Items {
		fmt.Fprintf(&b, "%s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// kubectl runs kubectl with args and returns its stdout; a failure fails t.
func (c *cluster) kubectlOK(t *testing.T, args ...string) string {
	t.Helper()
	out, err := c.kubectlRun(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func (c *cluster) kubectlRun(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v: %s", err, stderr.String())
	}
	return stdout.String(), nil
}

// crustVolumes is what `crustctl ls` in the crustd pod shows: the node's descriptors.
func (c *cluster) crustVolumes(t *testing.T) []*crustv1.Volume {
	t.Helper()
	out := c.kubectlOK(t, "-n", "crust-system", "exec", "daemonset/crustd", "--", "crustctl", "-o", "json", "ls")
	var resp crustv1.ListVolumesResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("crustctl -o json ls: %v\n%s", err, out)
	}
	return resp.GetVolumes()
}

// podVolumes is the descriptors crustd holds for a pod.
func (c *cluster) podVolumes(t *testing.T, uid string) []*crustv1.Volume {
	t.Helper()
	var vs []*crustv1.Volume
	for _, v := range c.crustVolumes(t) {
		if v.GetSpec().GetPodUid() == uid {
			vs = append(vs, v)
		}
	}
	return vs
}

// nsPath is path inside the node's mount namespace, as the host reaches it.
func (c *cluster) nsPath(path string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", c.nsPID), path)
}

// nsMounts lists the mount points at or under dir in the node's mount namespace.
func (c *cluster) nsMounts(t *testing.T, dir string) []string {
	t.Helper()
	ms := c.nsMountInfos(t, dir)
	mps := make([]string, 0, len(ms))
	for _, m := range ms {
		mps = append(mps, m.Mountpoint)
	}
	return mps
}

// nsMountInfos is nsMounts with each mount's entry of the node's mount table.
func (c *cluster) nsMountInfos(t *testing.T, dir string) []*mountinfo.Info {
	t.Helper()
	ms, err := mountInfosIn(fmt.Sprintf("/proc/%d/mountinfo", c.nsPID), dir)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// mountsIn lists the mount points at or under dir in the mountinfo table at path.
func mountsIn(path, dir string) ([]string, error) {
	ms, err := mountInfosIn(path, dir)
	mps := make([]string, 0, len(ms))
	for _, m := range ms {
		mps = append(mps, m.Mountpoint)
	}
	return mps, err
}

// mountInfosIn is mountsIn with each mount's entry.
func mountInfosIn(path, dir string) ([]*mountinfo.Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	ms, err := mountinfo.GetMountsFromReader(f, mountinfo.PrefixFilter(filepath.Clean(dir)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ms, nil
}

// cri is a client of the node's container runtime (containerd's CRI), closed at the test's end.
func (c *cluster) cri(t *testing.T) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(c.run, "containerd", "containerd.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// sandboxOf finds the pod's sandbox through CRI, as a runtime on the node would, and returns its id
// and runtime handler.
func (c *cluster) sandboxOf(t *testing.T, uid string) (id, handler string) {
	t.Helper()
	resp, err := c.cri(t).ListPodSandbox(ctxT(t), &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{
			LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid},
			State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetItems()) != 1 {
		t.Fatalf("%d ready sandboxes for pod %s, want 1", len(resp.GetItems()), uid)
	}
	return resp.GetItems()[0].GetId(), resp.GetItems()[0].GetRuntimeHandler()
}

// containerOf is the CRI id of a running container of a pod.
func (c *cluster) containerOf(t *testing.T, uid, name string) string {
	t.Helper()
	resp, err := c.cri(t).ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{
			LabelSelector: map[string]string{"io.kubernetes.pod.uid": uid, "io.kubernetes.container.name": name},
			State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetContainers()) != 1 {
		t.Fatalf("%d running containers %s in pod %s, want 1", len(resp.GetContainers()), name, uid)
	}
	return resp.GetContainers()[0].GetId()
}

// stopContainer stops a container through CRI, as a crash would end it; kubelet restarts it.
func (c *cluster) stopContainer(t *testing.T, id string) {
	t.Helper()
	if _, err := c.cri(t).StopContainer(ctxT(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
		t.Fatal(err)
	}
}

// volumeStats is one volume's entry in kubelet's /stats/summary.
type volumeStats struct {
	Name           string `json:"name"`
	CapacityBytes  int64  `json:"capacityBytes"`
	UsedBytes      int64  `json:"usedBytes"`
	AvailableBytes int64  `json:"availableBytes"`
	PVCRef         *struct {
		Name string `json:"name"`
	} `json:"pvcRef"`
}

// kubeletVolumeStats asks kubelet itself for its stats summary (the API server refuses to proxy to a
// loopback node) and returns the pod's volume stats by volume name.
func (c *cluster) kubeletVolumeStats(t *testing.T, uid string) map[string]volumeStats {
	t.Helper()
	pki := filepath.Join(c.run, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "apiserver-kubelet-client.crt"), filepath.Join(pki, "apiserver-kubelet-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	port := os.Getenv("KUBELET_PORT")
	if port == "" {
		port = "10250"
	}
	resp, err := hc.Get("https://127.0.0.1:" + port + "/stats/summary")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var sum struct {
		Pods []struct {
			PodRef struct {
				UID string `json:"uid"`
			} `json:"podRef"`
			Volume []volumeStats `json:"volume"`
		} `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&sum); err != nil {
		t.Fatal(err)
	}
	out := map[string]volumeStats{}
	for _, p := range sum.Pods {
		if p.PodRef.UID == uid {
			for _, v := range p.Volume {
				out[v.Name] = v
			}
		}
	}
	return out
}

// guestStatfs is the statfs of path in a pod's container in the guest: total and used bytes as df
// computes them.
func guestStatfs(t *testing.T, m *podShell, path string) (total, used int64) {
	t.Helper()
	out := m.ExecOK("stat", "-f", "-c", "%S %b %f", path)
	var bs, blocks, free int64
	if _, err := fmt.Sscan(out, &bs, &blocks, &free); err != nil {
		t.Fatalf("stat -f %s: %q: %v", path, out, err)
	}
	return bs * blocks, bs * (blocks - free)
}

// logicalVolumes lists the example volume group's logical volumes, asked of LVM on the host.
func (c *cluster) logicalVolumes(t *testing.T) []string {
	t.Helper()
	dev, err := os.ReadFile(filepath.Join(c.run, "vg", "device"))
	if err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(string(dev))
	cfg := fmt.Sprintf(`devices { use_devicesfile=0 obtain_device_list_from_udev=0 global_filter=["a|^%s$|","r|.*|"] } global { activation=0 }`, d)
	cmd := exec.Command("lvm", "lvs", "--config", cfg, "--noheadings", "-o", "lv_name", "crust-example")
	cmd.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("lvs: %v", err)
	}
	return strings.Fields(string(out))
}

// waitPodEvent waits until an event with reason, whose message holds want, is recorded on pod ns/name.
func (c *cluster) waitPodEvent(t *testing.T, ns, name, reason, want string) string {
	t.Helper()
	var msg string
	waitFor(t, time.Minute, "event "+reason+" on pod "+ns+"/"+name, func() (bool, error) {
		evs, err := c.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == reason && strings.Contains(e.Message, want) {
				msg = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("events: %s", c.events(ns, name))
	})
	return msg
}
