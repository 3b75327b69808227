package csiproxy

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/volume"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

// fakePods is a PodSource from maps.
type fakePods struct {
	pods    map[string]Pod    // by namespace/name
	classes map[string]string // RuntimeClass name to handler
}

func (f fakePods) Pod(ns, name string) (Pod, bool) { p, ok := f.pods[ns+"/"+name]; return p, ok }
func (f fakePods) PodByUID(uid string) (Pod, bool) {
	for _, p := range f.pods {
		if p.UID == uid {
			return p, true
		}
	}
	return Pod{}, false
}
func (f fakePods) RuntimeHandler(c string) (string, bool) {
	h, ok := f.classes[c]
	return h, ok
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csi.VolumeCapability { return blockCapability(mountCap()) }

func TestDecide(t *testing.T) {
	pods := fakePods{
		pods: map[string]Pod{
			"ns/runc":      {Namespace: "ns", Name: "runc", UID: "u-runc"},
			"ns/kata":      {Namespace: "ns", Name: "kata", UID: "u-kata", RuntimeClassName: "kata"},
			"ns/kata-rc":   {Namespace: "ns", Name: "kata-rc", UID: "u-kata-rc", RuntimeClassName: "fast-vm"},
			"ns/gvisor":    {Namespace: "ns", Name: "gvisor", UID: "u-gvisor", RuntimeClassName: "gvisor"},
			"ns/renamedrc": {Namespace: "ns", Name: "renamedrc", UID: "u-r", RuntimeClassName: "kata"},
		},
		// fast-vm's handler is kata-qemu; "kata" is not in the cache, so its name is the handler.
		classes: map[string]string{"fast-vm": "kata-qemu", "gvisor": "runsc"},
	}
	handlers := client.Handlers{"kata", "kata-qemu"}
	on := map[string]string{DeferKey: "true"}
	withPod := func(name, uid string) map[string]string {
		m := map[string]string{DeferKey: "True", podNamespaceKey: "ns", podNameKey: name}
		if uid != "" {
			m[podUIDKey] = uid
		}
		return m
	}
	tests := []struct {
		name    string
		in      DecideInput
		want    client.Decision
		wantErr bool
	}{
		{"no flag", DecideInput{Capability: mountCap(), VolumeContext: map[string]string{}}, client.PassThrough, false},
		{"flag false", DecideInput{Capability: mountCap(), VolumeContext: map[string]string{DeferKey: "false"}}, client.PassThrough, false},
		{"flag garbage", DecideInput{Capability: mountCap(), VolumeContext: map[string]string{DeferKey: "yes"}}, client.PassThrough, false},
		{"flag 1", DecideInput{Capability: mountCap(), VolumeContext: map[string]string{DeferKey: "1"}}, client.Defer, false},
		{"flag with spaces and case", DecideInput{Capability: mountCap(), VolumeContext: map[string]string{DeferKey: " TRUE "}}, client.Defer, false},
		{"block capability", DecideInput{Capability: blockCap(), VolumeContext: on}, client.PassThrough, false},
		{"nil capability", DecideInput{VolumeContext: on}, client.PassThrough, false},
		{"no pod source", DecideInput{Capability: mountCap(), VolumeContext: on}, client.Defer, false},
		{"no pod source, pod info ignored", DecideInput{Capability: mountCap(), VolumeContext: withPod("runc", "")}, client.Defer, false},
		{"staged as filesystem", DecideInput{Capability: mountCap(), VolumeContext: on, StagingPath: "/s"}, client.PassThrough, false},
		{"staged as block", DecideInput{Capability: mountCap(), VolumeContext: on, StagingPath: "/s", StagedAsBlock: true}, client.Defer, false},
		{"runc pod", DecideInput{Capability: mountCap(), VolumeContext: withPod("runc", "u-runc"), Deferral: deferral(pods, handlers, "", 0)}, client.HostMount, false},
		{"microVM pod, class name is the handler", DecideInput{Capability: mountCap(), VolumeContext: withPod("kata", ""), Deferral: deferral(pods, handlers, "", 0)}, client.Defer, false},
		{"microVM pod through RuntimeClass.handler", DecideInput{Capability: mountCap(), VolumeContext: withPod("kata-rc", "u-kata-rc"), Deferral: deferral(pods, handlers, "", 0)}, client.Defer, false},
		{"other sandbox runtime", DecideInput{Capability: mountCap(), VolumeContext: withPod("gvisor", ""), Deferral: deferral(pods, handlers, "", 0)}, client.HostMount, false},
		{"pod not in cache", DecideInput{Capability: mountCap(), VolumeContext: withPod("nope", ""), Deferral: deferral(pods, handlers, "", 0)}, client.PassThrough, true},
		{"pod recreated under the same name", DecideInput{Capability: mountCap(), VolumeContext: withPod("kata", "u-old"), Deferral: deferral(pods, handlers, "", 0)}, client.PassThrough, true},
		{"no flag beats pod", DecideInput{Capability: mountCap(), VolumeContext: map[string]string{podNamespaceKey: "ns", podNameKey: "kata"}, Deferral: deferral(pods, handlers, "", 0)}, client.PassThrough, false},
		{"pod with no class on a node whose default is a microVM", DecideInput{Capability: mountCap(), VolumeContext: withPod("runc", ""), Deferral: deferral(pods, handlers, "kata-qemu", 0)}, client.Defer, false},
		{"pod with no class on a node whose default is runc", DecideInput{Capability: mountCap(), VolumeContext: withPod("runc", ""), Deferral: deferral(pods, handlers, "runc", 0)}, client.HostMount, false},
		{"a class beats the node's default", DecideInput{Capability: mountCap(), VolumeContext: withPod("gvisor", ""), Deferral: deferral(pods, handlers, "kata", 0)}, client.HostMount, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := Decide(context.Background(), tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("Decide = %v (%q), %v; want %v, error %v", got, why, err, tc.want, tc.wantErr)
			}
			if tc.wantErr && (!errors.Is(err, client.ErrPodNotSeen) || !errors.Is(err, errdefs.ErrUnavailable)) {
				t.Fatalf("error %v is not ErrPodNotSeen, of kind Unavailable", err)
			}
		})
	}
}

// A malformed pattern stops the proxy at start with the flag and the pattern named.
func TestParseHandlers(t *testing.T) {
	for _, bad := range []string{"kata-[", "kata-[]", `kata\`} {
		_, err := New(context.Background(), Config{DriverAddress: "/nonexistent.sock", CrustSocket: "/nonexistent.sock",
			StateDir: "/nonexistent", MicroVMHandlers: []string{bad}}, nil, Deps{})
		if err == nil || !strings.Contains(err.Error(), "--microvm-handlers") || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("New with --microvm-handlers=%s: %v; want the flag and the pattern named", bad, err)
		}
	}
}

// TestInformerPods runs the real informer code on client-go's fake clientset (no API server runs here).
// The fake ignores field selectors, so the spec.nodeName restriction itself is not exercised; the test
// checks that pods and RuntimeClasses reach the cache, that late pods are waited for, and the decisions.
func TestInformerPods(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kata := "kata-fast"
	cs := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: types.UID("u1")},
			Spec: corev1.PodSpec{NodeName: "node-a", RuntimeClassName: &kata}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plain", UID: types.UID("u2")},
			Spec: corev1.PodSpec{NodeName: "node-a", InitContainers: []corev1.Container{{Name: "init",
				VolumeMounts: []corev1.VolumeMount{{Name: "a", MountPath: "/a"}, {Name: "b", MountPath: "/b", SubPathExpr: "$(POD)"}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: kata}, Handler: "kata-qemu"},
	)
	ip := syncedInformers(ctx, t, cs)
	// By UID too, with the phase and whether a container mounts a subPath.
	if p, ok := ip.PodByUID("u2"); !ok || p.Name != "plain" || p.Phase != "Running" || !p.SubPath {
		t.Fatalf("pod u2: %+v, %v; want plain, Running, with a subPath", p, ok)
	}
	if p, ok := ip.PodByUID("u1"); !ok || p.Name != "vm" || p.Phase != "" || p.SubPath {
		t.Fatalf("pod u1: %+v, %v; want vm, no phase, no subPath", p, ok)
	}
	if _, ok := ip.PodByUID("u9"); ok {
		t.Fatal("an unknown UID is found")
	}
	in := func(name string) DecideInput {
		return DecideInput{Capability: mountCap(), Deferral: deferral(ip, client.Handlers{"kata-qemu"}, "", 0),
			VolumeContext: map[string]string{DeferKey: "true", podNamespaceKey: "ns", podNameKey: name}}
	}
	if d, why, err := Decide(ctx, in("vm")); err != nil || d != client.Defer {
		t.Fatalf("vm pod: %v (%s), %v; want defer", d, why, err)
	}
	if d, why, err := Decide(ctx, in("plain")); err != nil || d != client.HostMount {
		t.Fatalf("plain pod: %v (%s), %v; want host-mount", d, why, err)
	}
	// A pod created while a publish waits for it is picked up within the wait.
	go func() {
		time.Sleep(200 * time.Millisecond) // the pod's lateness is what is under test
		_, _ = cs.CoreV1().Pods("ns").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "late", UID: "u3"},
			Spec: corev1.PodSpec{NodeName: "node-a", RuntimeClassName: &kata}}, metav1.CreateOptions{})
	}()
	late := in("late")
	late.Deferral.PodWait = time.Minute
	if d, why, err := Decide(ctx, late); err != nil || d != client.Defer {
		t.Fatalf("late pod: %v (%s), %v; want defer", d, why, err)
	}
	if _, _, err := Decide(ctx, in("never")); !errors.Is(err, client.ErrPodNotSeen) {
		t.Fatalf("missing pod: %v; want ErrPodNotSeen", err)
	}
	// The cache holds only what Pod reads.
	p, err := ip.pods.Pods("ns").Get("vm")
	if err != nil || len(p.Labels) != 0 || p.Spec.Containers != nil || p.Spec.RuntimeClassName == nil {
		t.Fatalf("cached pod %+v, %v: want a trimmed pod with its runtimeClassName", p, err)
	}
	p, err = ip.pods.Pods("ns").Get("plain")
	if want := []corev1.Container{{Name: "init", VolumeMounts: []corev1.VolumeMount{{Name: "b", SubPathExpr: "$(POD)"}}}}; err != nil ||
		!reflect.DeepEqual(p.Spec.InitContainers, want) || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("cached pod %+v, %v: want its subPath mounts alone and its phase", p, err)
	}
}

// A PersistentVolume's StorageClass answers for volumes whose context lacks crust.dev/defer: found by
// driver and volume handle, for the class's parameter; unknown volumes and classes are not found, and
// the cache keeps only driver, handle and class.
func TestClassDefers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pv := func(name, driver, handle, class string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"big": "label"}},
			Spec: corev1.PersistentVolumeSpec{StorageClassName: class, PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle, VolumeAttributes: map[string]string{"a": "b"}}}}}
	}
	cs := fake.NewClientset(
		pv("static", "d.example", "h1", "deferring"),
		pv("plain", "d.example", "h2", "plain"),
		pv("other-driver", "e.example", "h1", "plain"),
		pv("no-class", "d.example", "h3", ""),
		pv("gone-class", "d.example", "h4", "deleted"),
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "deferring"}, Provisioner: "d.example",
			Parameters: map[string]string{DeferKey: "true", volume.TotalIOPSKey: "50", volume.ReadBytesPerSecondKey: "1Mi", "type": "ssd"}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Provisioner: "d.example"},
	)
	ip := syncedInformers(ctx, t, cs)
	for _, tc := range []struct {
		driver, handle  string
		deferred, found bool
	}{
		{"d.example", "h1", true, true},
		{"e.example", "h1", false, true},
		{"d.example", "h2", false, true},
		{"d.example", "h3", false, false},
		{"d.example", "h4", false, false},
		{"d.example", "nope", false, false},
	} {
		if d, f := ip.ClassDefers(tc.driver, tc.handle); d != tc.deferred || f != tc.found {
			t.Errorf("ClassDefers(%s, %s) = %v, %v; want %v, %v", tc.driver, tc.handle, d, f, tc.deferred, tc.found)
		}
	}
	objs, _ := ip.pvs.ByIndex(csiHandleIndex, "d.example/h1")
	if got := objs[0].(*corev1.PersistentVolume); len(got.Labels) != 0 || got.Spec.CSI.VolumeAttributes != nil {
		t.Errorf("cached PV %+v: want it trimmed", got)
	}
	// The proxy asks the class only when the volume context does not say.
	p := &Proxy{classes: ip, driverName: "d.example"}
	for _, tc := range []struct {
		ctx  map[string]string
		id   string
		want bool
	}{
		{nil, "h1", true},
		{map[string]string{DeferKey: "false"}, "h1", false},
		{map[string]string{DeferKey: "true"}, "h2", true},
		{map[string]string{"x": "y"}, "h2", false},
		{nil, "nope", false},
	} {
		if got := p.deferRequested(ctx, tc.ctx, tc.id); got != tc.want {
			t.Errorf("deferRequested(%v, %s) = %v, want %v", tc.ctx, tc.id, got, tc.want)
		}
	}
	// The class's I/O limits come with its crust.dev/defer, where the context lacks them; the class's
	// other parameters never do, and a context that holds crust.dev/defer is taken as it is.
	for _, tc := range []struct {
		ctx, want map[string]string
	}{
		{map[string]string{"x": "y", volume.ReadBytesPerSecondKey: "2Mi"},
			map[string]string{"x": "y", DeferKey: "true", volume.TotalIOPSKey: "50", volume.ReadBytesPerSecondKey: "2Mi"}},
		{map[string]string{DeferKey: "true"}, map[string]string{DeferKey: "true"}},
	} {
		before := maps.Clone(tc.ctx)
		if got := p.volumeContext(ctx, tc.ctx, "h1"); !maps.Equal(got, tc.want) || !maps.Equal(tc.ctx, before) {
			t.Errorf("volumeContext(%v) = %v, want %v (and the argument unchanged)", before, got, tc.want)
		}
	}
}

// syncedInformers starts the proxy's informers for node-a on cs and waits until they have synced.
func syncedInformers(ctx context.Context, t *testing.T, cs kubernetes.Interface) *informerPods {
	t.Helper()
	ip, err := newInformerPods(ctx, cs, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !ip.waitSynced(sctx) {
		t.Fatal("informers did not sync")
	}
	return ip
}
