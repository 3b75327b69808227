package guard

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
)

// apiServer is a stand-in for the API server's two review endpoints: tokens maps a token to its user,
// readers are the users allowed `get /metrics`, and every review is counted.
type apiServer struct {
	mu       sync.Mutex
	caller   string // the token the guard must ask with
	tokens   map[string]string
	readers  map[string]bool
	sarFails bool
	reviews  map[string]int
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reviews[r.URL.Path]++
	if r.Header.Get("Authorization") != "Bearer "+a.caller {
		http.Error(w, "the guard did not ask as its service account", http.StatusUnauthorized)
		return
	}
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		var tr authnv1.TokenReview
		_ = json.NewDecoder(r.Body).Decode(&tr)
		if u, ok := a.tokens[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: u, Groups: []string{"system:authenticated"}}}
		} else {
			tr.Status.Error = "invalid bearer token"
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(&tr)
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		if a.sarFails {
			http.Error(w, "etcd is down", http.StatusInternalServerError)
			return
		}
		var sar authzv1.SubjectAccessReview
		_ = json.NewDecoder(r.Body).Decode(&sar)
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = a.readers[sar.Spec.User] && na != nil && na.Verb == "get" && na.Path == "/metrics"
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(&sar)
	default:
		http.NotFound(w, r)
	}
}

// change makes a change to what the API server answers.
func (a *apiServer) change(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f()
}

func (a *apiServer) count(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reviews[path]
}

func TestGuard(t *testing.T) {
	api := &apiServer{caller: "crustd-sa-token", tokens: map[string]string{"prom": "system:serviceaccount:monitoring:prometheus", "nobody": "system:serviceaccount:default:nobody"},
		readers: map[string]bool{"system:serviceaccount:monitoring:prometheus": true}, reviews: map[string]int{}}
	srv := httptest.NewTLSServer(api)
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("crustd-sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := New(APIServer{URL: srv.URL, CAFile: ca, TokenFile: tokenFile}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	g.now = func() time.Time { return now }
	served := 0
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		_, _ = io.WriteString(w, "crust_build_info 1\n")
	}))
	get := func(auth string) int {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	const tr, sar = "/apis/authentication.k8s.io/v1/tokenreviews", "/apis/authorization.k8s.io/v1/subjectaccessreviews"

	for _, tc := range []struct {
		name, auth string
		code       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"not a bearer token", "Basic cHJvbTpwcm9t", http.StatusUnauthorized},
		{"a token the API server rejects", "Bearer forged", http.StatusUnauthorized},
		{"a user without the permission", "Bearer nobody", http.StatusForbidden},
		{"a user with it", "Bearer prom", http.StatusOK},
		{"the scheme in any case", "bearer prom", http.StatusOK},
	} {
		if code := get(tc.auth); code != tc.code {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.code)
		}
	}
	if served != 2 {
		t.Errorf("the handler ran %d times, want 2 (only for the allowed requests)", served)
	}
	// Answers are cached: asking again costs no review, until they expire.
	trs, sars := api.count(tr), api.count(sar)
	if trs != 3 || sars != 2 {
		t.Errorf("%d token reviews and %d access reviews, want 3 and 2", trs, sars)
	}
	get("Bearer prom")
	get("Bearer forged")
	get("Bearer nobody")
	if api.count(tr) != trs || api.count(sar) != sars {
		t.Errorf("cached answers asked again: %d token reviews, %d access reviews", api.count(tr), api.count(sar))
	}
	// A denial is kept 30 s, a permission 5 min: after 31 s only the denied user is asked about again
	// (and every token, whose answers last a minute, is not).
	api.change(func() { api.readers["system:serviceaccount:default:nobody"] = true })
	now = now.Add(31 * time.Second)
	if code := get("Bearer nobody"); code != http.StatusOK {
		t.Errorf("a permission granted after a denial: %d once the denial expired", code)
	}
	get("Bearer prom")
	if api.count(sar) != sars+1 || api.count(tr) != trs {
		t.Errorf("after 31 s: %d access reviews (want %d), %d token reviews (want %d)", api.count(sar), sars+1, api.count(tr), trs)
	}

	// A rotated service-account token is used at the next review.
	api.change(func() { api.caller = "rotated" })
	if err := os.WriteFile(tokenFile, []byte("rotated"), 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(10 * time.Minute)
	if code := get("Bearer prom"); code != http.StatusOK {
		t.Errorf("after the guard's token rotated: %d", code)
	}

	// An access review that fails is a 500, and is not cached.
	now = now.Add(10 * time.Minute)
	for _, fails := range []bool{true, false} {
		api.change(func() { api.sarFails = fails })
		if code, want := get("Bearer prom"), map[bool]int{true: http.StatusInternalServerError, false: http.StatusOK}[fails]; code != want {
			t.Errorf("with the access review failing %v: %d, want %d", fails, code, want)
		}
	}
}

func TestNewNeedsTheCA(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(APIServer{URL: "https://127.0.0.1:1", CAFile: filepath.Join(dir, "none")}, slog.Default()); err == nil {
		t.Error("New with no CA file: no error")
	}
	bad := filepath.Join(dir, "bad")
	_ = os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := New(APIServer{URL: "https://127.0.0.1:1", CAFile: bad}, slog.Default()); err == nil {
		t.Error("New with a CA file that holds no certificate: no error")
	}
}
