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
	listersstoragev1 "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"crust.dev/crust/api/version"
)

// informerPods is a PodSource and a ClassSource backed by informers: pods bound to one node (field
// selector spec.nodeName), trimmed to what the proxy reads and indexed by UID too; RuntimeClasses; CSI PersistentVolumes,
// trimmed to driver, handle and class and indexed by driver and handle; StorageClasses.
type informerPods struct {
	pods    listerscorev1.PodLister
	byUID   cache.Indexer // the pods, indexed by UID too (podUIDIndex)
	classes listersnodev1.RuntimeClassLister
	pvs     cache.Indexer
	scs     listersstoragev1.StorageClassLister
	synced  []cache.InformerSynced
}

// csiHandleIndex indexes PersistentVolumes by "<driver>/<volume handle>".
const csiHandleIndex = "csiHandle"

// podUIDIndex indexes pods by UID: a target path names its pod by UID alone.
const podUIDIndex = "uid"

// ClassSource answers, from a cache, whether the StorageClass of the PersistentVolume a driver knows by a
// volume handle asks for deferral, and with what parameters (crust's I/O limits among them).
type ClassSource interface {
	// ClassDefers reports found=false when no such PersistentVolume, or not its StorageClass, is known.
	ClassDefers(driver, volumeHandle string) (deferred, found bool)
	// ClassParameters returns that StorageClass's parameters, found as ClassDefers finds it; the map
	// must not be modified.
	ClassParameters(driver, volumeHandle string) (params map[string]string, found bool)
}

// newInformerPods starts the informers on cs; they run until ctx ends. It does not wait for them to sync
// (Pod answers not-found until they have).
func newInformerPods(ctx context.Context, cs kubernetes.Interface, nodeName string) (*informerPods, error) {
	podFactory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	podInf := podFactory.Core().V1().Pods()
	// Keep only what Pod reads: a node runs few pods, but each full pod object is large.
	if err := podInf.Informer().SetTransform(func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		out := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion},
			Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, RuntimeClassName: p.Spec.RuntimeClassName,
				InitContainers: subPathMounts(p.Spec.InitContainers), Containers: subPathMounts(p.Spec.Containers)},
			Status: corev1.PodStatus{Phase: p.Status.Phase},
		}
		if sc := p.Spec.SecurityContext; sc != nil && sc.FSGroupChangePolicy != nil {
			out.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroupChangePolicy: sc.FSGroupChangePolicy}
		}
		return out, nil
	}); err != nil {
		return nil, err
	}
	if err := podInf.Informer().AddIndexers(cache.Indexers{podUIDIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	classFactory := informers.NewSharedInformerFactory(cs, 0)
	classInf := classFactory.Node().V1().RuntimeClasses()
	pvInf := classFactory.Core().V1().PersistentVolumes()
	// Keep only what ClassDefers reads; index by driver and handle.
	if err := pvInf.Informer().SetTransform(func(obj any) (any, error) {
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok || pv.Spec.CSI == nil {
			return obj, nil
		}
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pv.Name, ResourceVersion: pv.ResourceVersion},
			Spec: corev1.PersistentVolumeSpec{StorageClassName: pv.Spec.StorageClassName, PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: pv.Spec.CSI.Driver, VolumeHandle: pv.Spec.CSI.VolumeHandle}}},
		}, nil
	}); err != nil {
		return nil, err
	}
	if err := pvInf.Informer().AddIndexers(cache.Indexers{csiHandleIndex: func(obj any) ([]string, error) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok && pv.Spec.CSI != nil {
			return []string{pv.Spec.CSI.Driver + "/" + pv.Spec.CSI.VolumeHandle}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	scInf := classFactory.Storage().V1().StorageClasses()
	ip := &informerPods{
		pods:    podInf.Lister(),
		byUID:   podInf.Informer().GetIndexer(),
		classes: classInf.Lister(),
		pvs:     pvInf.Informer().GetIndexer(),
		scs:     scInf.Lister(),
		synced: []cache.InformerSynced{podInf.Informer().HasSynced, classInf.Informer().HasSynced,
			pvInf.Informer().HasSynced, scInf.Informer().HasSynced},
	}
	podFactory.Start(ctx.Done())
	classFactory.Start(ctx.Done())
	return ip, nil
}

// ClassDefers implements ClassSource.
func (ip *informerPods) ClassDefers(driver, volumeHandle string) (bool, bool) {
	params, found := ip.ClassParameters(driver, volumeHandle)
	return found && DeferRequested(params), found
}

// ClassParameters implements ClassSource.
func (ip *informerPods) ClassParameters(driver, volumeHandle string) (map[string]string, bool) {
	objs, err := ip.pvs.ByIndex(csiHandleIndex, driver+"/"+volumeHandle)
	if err != nil || len(objs) != 1 {
		return nil, false
	}
	pv := objs[0].(*corev1.PersistentVolume)
	if pv.Spec.StorageClassName == "" {
		return nil, false
	}
	sc, err := ip.scs.Get(pv.Spec.StorageClassName)
	if err != nil {
		return nil, false
	}
	return sc.Parameters, true
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
	return podOf(p), true
}

// PodByUID implements PodSource.
func (ip *informerPods) PodByUID(uid string) (Pod, bool) {
	objs, err := ip.byUID.ByIndex(podUIDIndex, uid)
	if err != nil || len(objs) != 1 {
		return Pod{}, false
	}
	p, ok := objs[0].(*corev1.Pod)
	if !ok {
		return Pod{}, false
	}
	return podOf(p), true
}

// podOf is what the proxy reads of p, a pod as the informer keeps it.
func podOf(p *corev1.Pod) Pod {
	out := Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Phase: string(p.Status.Phase)}
	if p.Spec.RuntimeClassName != nil {
		out.RuntimeClassName = *p.Spec.RuntimeClassName
	}
	if sc := p.Spec.SecurityContext; sc != nil && sc.FSGroupChangePolicy != nil {
		out.FSGroupChangePolicy = string(*sc.FSGroupChangePolicy)
	}
	out.SubPath = len(subPathMounts(p.Spec.InitContainers)) > 0 || len(subPathMounts(p.Spec.Containers)) > 0
	return out
}

// subPathMounts trims containers to those with a volume mount of a subPath or subPathExpr, each to its
// name and those mounts, each to its volume's name and the subPath; nil when none has one.
func subPathMounts(containers []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range containers {
		var mounts []corev1.VolumeMount
		for _, m := range c.VolumeMounts {
			if m.SubPath != "" || m.SubPathExpr != "" {
				mounts = append(mounts, corev1.VolumeMount{Name: m.Name, SubPath: m.SubPath, SubPathExpr: m.SubPathExpr})
			}
		}
		if mounts != nil {
			out = append(out, corev1.Container{Name: c.Name, VolumeMounts: mounts})
		}
	}
	return out
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
	cfg.UserAgent = "crust-csi-proxy/" + version.Get().Version
	cfg.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(cfg)
}
