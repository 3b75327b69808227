package csiproxy

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersnodev1 "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// informerPods is a PodSource backed by two informers: pods bound to one node (field selector
// spec.nodeName), trimmed to what the proxy reads, and RuntimeClasses.
type informerPods struct {
	pods    listerscorev1.PodLister
	classes listersnodev1.RuntimeClassLister
	synced  []cache.InformerSynced
}

// newInformerPods starts the informers on cs; they run until ctx ends. It does not wait for them to sync
// (Pod answers not-found until they have).
func newInformerPods(ctx context.Context, cs kubernetes.Interface, nodeName string) (*informerPods, error) {
	podFactory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	podInf := podFactory.Core().V1().Pods()
	// Keep only what Decide reads: a node runs few pods, but each full pod object is large.
	if err := podInf.Informer().SetTransform(func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
			Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, RuntimeClassName: p.Spec.RuntimeClassName},
		}, nil
	}); err != nil {
		return nil, err
	}
	classFactory := informers.NewSharedInformerFactory(cs, 0)
	classInf := classFactory.Node().V1().RuntimeClasses()
	ip := &informerPods{
		pods:    podInf.Lister(),
		classes: classInf.Lister(),
		synced:  []cache.InformerSynced{podInf.Informer().HasSynced, classInf.Informer().HasSynced},
	}
	podFactory.Start(ctx.Done())
	classFactory.Start(ctx.Done())
	return ip, nil
}

// waitSynced waits until both informers have synced, or ctx ends (false).
func (ip *informerPods) waitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), ip.synced...)
}

// Pod implements PodSource.
func (ip *informerPods) Pod(namespace, name string) (Pod, bool) {
	p, err := ip.pods.Pods(namespace).Get(name)
	if err != nil {
		return Pod{}, false
	}
	out := Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}
	if p.Spec.RuntimeClassName != nil {
		out.RuntimeClassName = *p.Spec.RuntimeClassName
	}
	return out, true
}

// RuntimeHandler implements PodSource.
func (ip *informerPods) RuntimeHandler(runtimeClass string) (string, bool) {
	rc, err := ip.classes.Get(runtimeClass)
	if err != nil {
		return "", false
	}
	return rc.Handler, true
}

// InCluster is the --kubeconfig value that means: use the pod's service account.
const InCluster = "in-cluster"

// kubeClient builds a clientset from a kubeconfig file, or from the service account for InCluster.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	path := kubeconfig
	if path == InCluster {
		path = "" // clientcmd then takes the in-cluster configuration
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "crust-csi-proxy"
	cfg.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(cfg)
}
