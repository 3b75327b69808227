package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkSecureMetrics checks crustd's authenticated /metrics at url (metrics.secure.enabled): no token is
// 401, the token of a service account without the permission 403, and one bound to the ClusterRole
// crust-metrics-reader reads crust_build_info.
func (c *cluster) checkSecureMetrics(t *testing.T, ns, url string) {
	t.Helper()
	ctx := ctxT(t)
	token := func(sa string) string {
		t.Helper()
		if _, err := c.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, nobody := token("scraper"), token("nobody")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "crust-metrics-reader-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "crust-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}}}
	if _, err := c.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	// crustd's certificate is self-signed: what a PodMonitor with insecureSkipVerify does.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	for _, tc := range []struct {
		who, token string
		code       int
	}{{"no token", "", http.StatusUnauthorized}, {"a service account without the permission", nobody, http.StatusForbidden},
		{"a service account bound to crust-metrics-reader", scraper, http.StatusOK}} {
		var body string
		// RBAC reaches the API server's authorizer a moment after the binding is made.
		waitFor(t, time.Minute, tc.who+" answered "+strconv.Itoa(tc.code), func() (bool, error) {
			code, b, err := get(tc.token)
			body = b
			return code == tc.code, fmt.Errorf("%d %v: %.200s", code, err, b)
		})
		t.Logf("GET %s with %s: %d", url, tc.who, tc.code)
		if tc.code == http.StatusOK && !strings.Contains(body, "crust_build_info{") {
			t.Errorf("%s read no crust_build_info:\n%.500s", tc.who, body)
		}
	}
}
