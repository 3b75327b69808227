package inject

import (
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// ProxyRules are what the node proxy may do with the API: watch its node's pods and the RuntimeClasses
// (to tell a microVM pod), read PersistentVolumes and StorageClasses (to learn whether a volume's class
// defers it), and write Events on pods. deploy/csi-proxy/rbac.yaml grants the same.
var ProxyRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"node.k8s.io"}, Resources: []string{"runtimeclasses"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

// RoleName names the ClusterRole and ClusterRoleBinding made for one driver's ServiceAccount: one pair
// an account, so that drivers in other namespaces, or other releases, never share or replace it.
func RoleName(namespace, serviceAccount string) string {
	return "crust-csi-proxy:" + namespace + ":" + serviceAccount
}

var labels = map[string]string{"app.kubernetes.io/name": "crust-csi-proxy", "app.kubernetes.io/part-of": "crust"}

func clusterRole(namespace, sa string) *unstructured.Unstructured {
	r := &rbacv1.ClusterRole{Rules: ProxyRules}
	r.APIVersion, r.Kind = "rbac.authorization.k8s.io/v1", "ClusterRole"
	r.Name, r.Labels = RoleName(namespace, sa), labels
	return toUnstructured(r)
}

func clusterRoleBinding(namespace, sa string) *unstructured.Unstructured {
	b := &rbacv1.ClusterRoleBinding{
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: RoleName(namespace, sa)},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: namespace}},
	}
	b.APIVersion, b.Kind = "rbac.authorization.k8s.io/v1", "ClusterRoleBinding"
	b.Name, b.Labels = RoleName(namespace, sa), labels
	return toUnstructured(b)
}

// toUnstructured converts one of the typed objects above; they always convert.
func toUnstructured(obj any) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		panic(err)
	}
	unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
	return &unstructured.Unstructured{Object: m}
}
