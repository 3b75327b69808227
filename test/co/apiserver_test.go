package co

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"crust.dev/crust/internal/testutil/harness"
)

// TestAPIServerInformers runs client-go's informers (as crust-csi-proxy builds them: pods of one node by
// field selector, RuntimeClasses) against the APIServer through a kubeconfig it wrote: objects present
// before the informers start, added, changed and deleted after, all reach the caches.
func TestAPIServerInformers(t *testing.T) {
	a := NewAPIServer()
	defer a.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := a.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.PutRuntimeClass("kata", "kata-qemu")
	a.putPod(&Pod{Namespace: "ns", Name: "before", UID: "u1"}, "node-1")
	a.putPod(&Pod{Namespace: "ns", Name: "elsewhere", UID: "u2"}, "node-2")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "node-1").String()
	}))
	pods := pf.Core().V1().Pods()
	cf := informers.NewSharedInformerFactory(cs, 0)
	classes := cf.Node().V1().RuntimeClasses()
	synced := []cache.InformerSynced{pods.Informer().HasSynced, classes.Informer().HasSynced}
	pf.Start(ctx.Done())
	cf.Start(ctx.Done())
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), synced...) {
		t.Fatal("caches did not sync")
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		harness.Eventually(t, 10*time.Second, what, ok)
	}
	if p, err := pods.Lister().Pods("ns").Get("before"); err != nil || string(p.UID) != "u1" {
		t.Errorf("pod before start: %v %v", p, err)
	}
	if _, err := pods.Lister().Pods("ns").Get("elsewhere"); err == nil {
		t.Error("a pod of another node is in the cache")
	}
	if rc, err := classes.Lister().Get("kata"); err != nil || rc.Handler != "kata-qemu" {
		t.Errorf("RuntimeClass: %v %v", rc, err)
	}
	a.PutRuntimeClass("vm", "crust-microvm")
	a.putPod(&Pod{Namespace: "ns", Name: "after", UID: "u3", RuntimeClassName: "vm"}, "node-1")
	eventually("the new pod", func() bool {
		p, err := pods.Lister().Pods("ns").Get("after")
		return err == nil && p.Spec.RuntimeClassName != nil && *p.Spec.RuntimeClassName == "vm"
	})
	eventually("the new RuntimeClass", func() bool { _, err := classes.Lister().Get("vm"); return err == nil })
	a.putPod(&Pod{Namespace: "ns", Name: "after", UID: "u4"}, "node-1")
	eventually("the replaced pod", func() bool {
		p, err := pods.Lister().Pods("ns").Get("after")
		return err == nil && p.UID == "u4" && p.Spec.RuntimeClassName == nil
	})
	a.deletePod("ns", "after")
	eventually("the pod to go", func() bool { _, err := pods.Lister().Pods("ns").Get("after"); return err != nil })
}

// TestAPIServerListWatch checks a plain list, then a watch from the list's resource version (what
// client-go does without WatchListClient) in one namespace.
func TestAPIServerListWatch(t *testing.T) {
	a := NewAPIServer()
	defer a.Close()
	cs, err := kubernetes.NewForConfig(restConfig(a))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a.putPod(&Pod{Namespace: "ns", Name: "p1", UID: "u1"}, "n")
	l, err := cs.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) != 1 || l.Items[0].Name != "p1" || l.ResourceVersion == "" {
		t.Fatalf("list: %v %v", l, err)
	}
	w, err := cs.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	a.putPod(&Pod{Namespace: "other", Name: "p0", UID: "u0"}, "n")
	a.putPod(&Pod{Namespace: "ns", Name: "p2", UID: "u2"}, "n")
	a.deletePod("ns", "p1")
	for _, want := range []struct {
		typ  watch.EventType
		name string
	}{{watch.Added, "p2"}, {watch.Deleted, "p1"}} {
		select {
		case ev := <-w.ResultChan():
			if p, ok := ev.Object.(*corev1.Pod); !ok || ev.Type != want.typ || p.Name != want.name {
				t.Errorf("event %s %v, want %s %s", ev.Type, ev.Object, want.typ, want.name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s event", want.typ)
		}
	}
	if _, err := cs.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{ResourceVersion: "999"}); err == nil {
		t.Error("a watch from a future resource version succeeded")
	}
}

func restConfig(a *APIServer) *rest.Config { return &rest.Config{Host: a.URL()} }
