package co

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// APIServer serves the part of the Kubernetes API that node-local components such as crust-csi-proxy
// read through client-go informers: pods (GET /api/v1/pods and /api/v1/namespaces/NS/pods, with the
// spec.nodeName field selector) and RuntimeClasses (GET /apis/node.k8s.io/v1/runtimeclasses), listed and
// watched, over plain HTTP on a loopback port, without authentication. Watches follow the API server's
// semantics: from a resource version (events after it), without one (the current objects as ADDED
// first), or streaming the initial list (sendInitialEvents=true: ADDED for every object, then a BOOKMARK
// annotated k8s.io/initial-events-end, as client-go's WatchListClient expects). Other field selectors,
// label selectors, paging and every other resource and verb are not served.
type APIServer struct {
	srv    *httptest.Server
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex
	rv       uint64
	pods     map[string]*corev1.Pod
	classes  map[string]*nodev1.RuntimeClass
	history  []apiEvent
	watchers map[*apiWatcher]struct{}
}

// apiEvent is one change, kept for watches that resume from a resource version.
type apiEvent struct {
	rv       uint64
	resource string
	obj      any
	typ      string
}

type apiWatcher struct {
	resource, namespace, node string
	ch                        chan []byte
}

const (
	resPods           = "pods"
	resRuntimeClasses = "runtimeclasses"
)

// NewAPIServer starts an APIServer; Close stops it.
func NewAPIServer() *APIServer {
	a := &APIServer{
		closed: make(chan struct{}), pods: map[string]*corev1.Pod{}, classes: map[string]*nodev1.RuntimeClass{},
		watchers: map[*apiWatcher]struct{}{},
	}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

// URL is the server's base URL.
func (a *APIServer) URL() string { return a.srv.URL }

// Close ends every watch and stops the server.
func (a *APIServer) Close() {
	a.once.Do(func() {
		close(a.closed)
		a.srv.CloseClientConnections()
		a.srv.Close()
	})
}

// WriteKubeconfig writes a kubeconfig for the server to path.
func (a *APIServer) WriteKubeconfig(path string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: co
  cluster:
    server: %s
contexts:
- name: co
  context:
    cluster: co
    user: co
current-context: co
users:
- name: co
  user: {}
`, a.srv.URL)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// PutRuntimeClass creates or replaces a RuntimeClass.
func (a *APIServer) PutRuntimeClass(name, handler string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	typ := "ADDED"
	if _, ok := a.classes[name]; ok {
		typ = "MODIFIED"
	}
	a.rv++
	rc := &nodev1.RuntimeClass{
		TypeMeta:   metav1.TypeMeta{Kind: "RuntimeClass", APIVersion: "node.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(NewUID()), ResourceVersion: strconv.FormatUint(a.rv, 10)},
		Handler:    handler,
	}
	a.classes[name] = rc
	a.emit(resRuntimeClasses, typ, rc)
}

// putPod creates or replaces the pod object of pod, bound to node.
func (a *APIServer) putPod(pod *Pod, node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := pod.Namespace + "/" + pod.Name
	typ := "ADDED"
	if _, ok := a.pods[key]; ok {
		typ = "MODIFIED"
	}
	a.rv++
	sa := pod.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID),
			ResourceVersion: strconv.FormatUint(a.rv, 10)},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa,
			SecurityContext: &corev1.PodSecurityContext{FSGroup: pod.FSGroup}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	if pod.RuntimeClassName != "" {
		p.Spec.RuntimeClassName = &pod.RuntimeClassName
	}
	for _, v := range pod.Volumes {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: v.Volume.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.Volume.Name, ReadOnly: v.ReadOnly}}})
	}
	a.pods[key] = p
	a.emit(resPods, typ, p)
}

// deletePod removes a pod object.
func (a *APIServer) deletePod(namespace, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := namespace + "/" + name
	p, ok := a.pods[key]
	if !ok {
		return
	}
	delete(a.pods, key)
	a.rv++
	gone := p.DeepCopy()
	gone.ResourceVersion = strconv.FormatUint(a.rv, 10)
	a.emit(resPods, "DELETED", gone)
}

// emit records an event and hands it to the watchers it concerns; a watcher too slow to take it is
// dropped (its stream ends, and client-go lists again). a.mu is held.
func (a *APIServer) emit(resource, typ string, obj any) {
	ev := apiEvent{rv: a.rv, resource: resource, obj: obj, typ: typ}
	a.history = append(a.history, ev)
	for w := range a.watchers {
		if !w.wants(ev) {
			continue
		}
		select {
		case w.ch <- encodeEvent(typ, obj):
		default:
			close(w.ch)
			delete(a.watchers, w)
		}
	}
}

func (w *apiWatcher) wants(ev apiEvent) bool {
	if ev.resource != w.resource {
		return false
	}
	if p, ok := ev.obj.(*corev1.Pod); ok {
		return (w.namespace == "" || p.Namespace == w.namespace) && (w.node == "" || p.Spec.NodeName == w.node)
	}
	return true
}

func encodeEvent(typ string, obj any) []byte {
	b, _ := json.Marshal(map[string]any{"type": typ, "object": obj})
	return append(b, '\n')
}

func (a *APIServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		apiError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" is not served")
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	aw := &apiWatcher{}
	switch {
	case len(parts) == 3 && parts[0] == "api" && parts[1] == "v1" && parts[2] == resPods:
		aw.resource = resPods
	case len(parts) == 5 && parts[0] == "api" && parts[1] == "v1" && parts[2] == "namespaces" && parts[4] == resPods:
		aw.resource, aw.namespace = resPods, parts[3]
	case len(parts) == 4 && parts[0] == "apis" && parts[1] == "node.k8s.io" && parts[2] == "v1" && parts[3] == resRuntimeClasses:
		aw.resource = resRuntimeClasses
	default:
		apiError(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	q := r.URL.Query()
	for _, term := range strings.Split(q.Get("fieldSelector"), ",") {
		k, v, _ := strings.Cut(term, "=")
		if k == "spec.nodeName" {
			aw.node = strings.TrimPrefix(v, "=")
		}
	}
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		a.watch(w, r, aw)
		return
	}
	a.mu.Lock()
	items := a.current(aw)
	rv := a.rv
	a.mu.Unlock()
	kind, apiVersion := "PodList", "v1"
	if aw.resource == resRuntimeClasses {
		kind, apiVersion = "RuntimeClassList", "node.k8s.io/v1"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": kind, "apiVersion": apiVersion,
		"metadata": map[string]string{"resourceVersion": strconv.FormatUint(rv, 10)}, "items": items,
	})
}

// current returns the objects aw wants, oldest first. a.mu is held.
func (a *APIServer) current(aw *apiWatcher) []any {
	var objs []any
	if aw.resource == resPods {
		for _, p := range a.pods {
			objs = append(objs, p)
		}
	} else {
		for _, c := range a.classes {
			objs = append(objs, c)
		}
	}
	var out []any
	for _, o := range objs {
		if aw.wants(apiEvent{resource: aw.resource, obj: o}) {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(x, y any) int {
		rx, _ := strconv.ParseUint(x.(metav1.Object).GetResourceVersion(), 10, 64)
		ry, _ := strconv.ParseUint(y.(metav1.Object).GetResourceVersion(), 10, 64)
		return cmp.Compare(rx, ry)
	})
	return out
}

func (a *APIServer) watch(w http.ResponseWriter, r *http.Request, aw *apiWatcher) {
	q := r.URL.Query()
	timeout := 30 * time.Minute
	if s, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	aw.ch = make(chan []byte, 1024)
	var initial [][]byte
	a.mu.Lock()
	switch from := q.Get("resourceVersion"); {
	case q.Get("sendInitialEvents") == "true":
		for _, o := range a.current(aw) {
			initial = append(initial, encodeEvent("ADDED", o))
		}
		initial = append(initial, encodeEvent("BOOKMARK", a.bookmark(aw.resource)))
	case from == "" || from == "0":
		for _, o := range a.current(aw) {
			initial = append(initial, encodeEvent("ADDED", o))
		}
	default:
		rv, err := strconv.ParseUint(from, 10, 64)
		if err != nil || rv > a.rv {
			a.mu.Unlock()
			apiError(w, http.StatusGone, "Expired", "too old or unknown resource version: "+from)
			return
		}
		for _, ev := range a.history {
			if ev.rv > rv && aw.wants(ev) {
				initial = append(initial, encodeEvent(ev.typ, ev.obj))
			}
		}
	}
	a.watchers[aw] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.watchers, aw)
		a.mu.Unlock()
	}()

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	write := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	for _, b := range initial {
		if !write(b) {
			return
		}
	}
	if flusher != nil {
		flusher.Flush()
	}
	end := time.NewTimer(timeout)
	defer end.Stop()
	for {
		select {
		case b, ok := <-aw.ch:
			if !ok || !write(b) {
				return
			}
		case <-r.Context().Done():
			return
		case <-a.closed:
			return
		case <-end.C:
			return
		}
	}
}

// bookmark is the BOOKMARK object that ends a watch's initial events. a.mu is held.
func (a *APIServer) bookmark(resource string) any {
	meta := metav1.ObjectMeta{ResourceVersion: strconv.FormatUint(a.rv, 10),
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}
	if resource == resPods {
		return &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: meta}
	}
	return &nodev1.RuntimeClass{TypeMeta: metav1.TypeMeta{Kind: "RuntimeClass", APIVersion: "node.k8s.io/v1"}, ObjectMeta: meta}
}

func apiError(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: metav1.StatusReason(reason), Code: int32(code),
	})
}
