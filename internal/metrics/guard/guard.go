// Package guard is the door of crust's authenticated /metrics endpoint, shared by crustd and
// crust-csi-proxy: what kube-rbac-proxy and Kubernetes' own components do before they serve metrics.
//
// Promises: a request passes only with a bearer token that the API server accepts (a TokenReview) and
// whose user may use the request's verb on its path as a non-resource URL (a SubjectAccessReview: `get`
// on `/metrics`, which a ClusterRole grants with nonResourceURLs). No token, a token the API server
// rejects, or a TokenReview that fails is 401; a user without the permission is 403; a
// SubjectAccessReview that fails is 500; in each case nothing of the wrapped handler runs. Answers are
// cached, as Kubernetes' delegating authenticator and authorizer cache them (a token's for a minute, a
// permission for five minutes when allowed and thirty seconds when denied), so a scrape every few
// seconds costs an API call a few times an hour; a failed review is not cached. The guard asks as the
// pod's service account, reading its token file again for every review, so a rotated token is used.
//
// Why not k8s.io/apiserver's delegating authenticator and authorizer, the library for this: linking them
// (with the client-go clientset they need) takes crustd's resident memory at start from 14 to 42 MiB,
// measured after package initialisation, against a budget of 48 MiB with 10,000 volumes held. This
// package speaks the two reviews over net/http with the API's own types (k8s.io/api), which costs 2 MiB.
package guard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// How long answers are kept.
const (
	tokenTTL = time.Minute
	allowTTL = 5 * time.Minute
	denyTTL  = 30 * time.Second
	// maxCached bounds each cache: a flood of made-up tokens cannot grow memory without end.
	maxCached = 1024
)

// APIServer is where, and as whom, the guard asks.
type APIServer struct {
	URL       string // https://HOST:PORT
	CAFile    string // the API server's CA bundle
	TokenFile string // the service account's bearer token
}

// InCluster is the APIServer of the pod's service account, found as client-go finds it.
func InCluster() (APIServer, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return APIServer{}, errors.New("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	const dir = "/var/run/secrets/kubernetes.io/serviceaccount/"
	return APIServer{URL: "https://" + net.JoinHostPort(host, port), CAFile: dir + "ca.crt", TokenFile: dir + "token"}, nil
}

// Guard authenticates and authorises requests against the API server. Create it with New.
type Guard struct {
	api    APIServer
	client *http.Client
	log    *slog.Logger
	now    func() time.Time

	mu     sync.Mutex
	tokens map[[sha256.Size]byte]entry[*authnv1.UserInfo] // nil user: rejected
	access map[string]entry[bool]
}

type entry[T any] struct {
	v       T
	expires time.Time
}

// New returns a Guard that asks api. It reads the CA bundle now: a missing one is an error.
func New(api APIServer, log *slog.Logger) (*Guard, error) {
	pem, err := os.ReadFile(api.CAFile)
	if err != nil {
		return nil, fmt.Errorf("the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the API server's CA: no certificate in %s", api.CAFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &Guard{
		api: api, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, log: log, now: time.Now,
		tokens: map[[sha256.Size]byte]entry[*authnv1.UserInfo]{}, access: map[string]entry[bool]{},
	}, nil
}

// Wrap returns next behind the guard.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="crust metrics"`)
			http.Error(w, "Unauthorized: a bearer token is needed", http.StatusUnauthorized)
			return
		}
		user, err := g.authenticate(r.Context(), strings.TrimSpace(token))
		if user == nil {
			g.log.Debug("metrics: not authenticated", "remote", r.RemoteAddr, "err", err)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		allowed, err := g.authorize(r.Context(), user, verb, r.URL.Path)
		if err != nil {
			g.log.Error("metrics: asking the API server whether a user may read them", "user", user.Username, "err", err)
			http.Error(w, "authorization failed", http.StatusInternalServerError)
			return
		}
		if !allowed {
			g.log.Debug("metrics: refused", "user", user.Username, "verb", verb, "path", r.URL.Path)
			http.Error(w, fmt.Sprintf("Forbidden: %s may not %s %s", user.Username, verb, r.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authenticate returns the token's user, or nil when the API server rejected it or could not be asked.
func (g *Guard) authenticate(ctx context.Context, token string) (*authnv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	if u, ok := lookup(g, g.tokens, key); ok {
		return u, nil
	}
	var review authnv1.TokenReview
	if err := g.ask(ctx, "/apis/authentication.k8s.io/v1/tokenreviews",
		&authnv1.TokenReview{TypeMeta: typeMeta("authentication.k8s.io/v1", "TokenReview"), Spec: authnv1.TokenReviewSpec{Token: token}}, &review); err != nil {
		return nil, err
	}
	var user *authnv1.UserInfo
	if review.Status.Authenticated {
		user = &review.Status.User
	}
	store(g, g.tokens, key, user, tokenTTL)
	if user == nil && review.Status.Error != "" {
		return nil, errors.New(review.Status.Error)
	}
	return user, nil
}

// authorize says whether user may use verb on the non-resource URL path.
func (g *Guard) authorize(ctx context.Context, user *authnv1.UserInfo, verb, path string) (bool, error) {
	key := strings.Join(append([]string{user.Username, user.UID, verb, path}, user.Groups...), "\x00")
	if ok, found := lookup(g, g.access, key); found {
		return ok, nil
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	var review authzv1.SubjectAccessReview
	if err := g.ask(ctx, "/apis/authorization.k8s.io/v1/subjectaccessreviews", &authzv1.SubjectAccessReview{
		TypeMeta: typeMeta("authorization.k8s.io/v1", "SubjectAccessReview"),
		Spec: authzv1.SubjectAccessReviewSpec{User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
			NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb}},
	}, &review); err != nil {
		return false, err
	}
	allowed := review.Status.Allowed && !review.Status.Denied
	ttl := denyTTL
	if allowed {
		ttl = allowTTL
	}
	store(g, g.access, key, allowed, ttl)
	return allowed, nil
}

// ask POSTs a review to the API server as the service account and decodes its answer into out.
func (g *Guard) ask(ctx context.Context, path string, in, out any) error {
	token, err := os.ReadFile(g.api.TokenFile)
	if err != nil {
		return fmt.Errorf("the service account's token: %w", err)
	}
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.api.URL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", path, resp.Status)
	}
	return json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 1<<20)).Decode(out)
}

func lookup[K comparable, V any](g *Guard, m map[K]entry[V], k K) (V, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := m[k]
	if !ok || !g.now().Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func store[K comparable, V any](g *Guard, m map[K]entry[V], k K, v V, ttl time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if len(m) >= maxCached {
		for k, e := range m {
			if !now.Before(e.expires) {
				delete(m, k)
			}
		}
		if len(m) >= maxCached {
			clear(m)
		}
	}
	m[k] = entry[V]{v: v, expires: now.Add(ttl)}
}

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}
