package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	crustv1 "crust.dev/crust/api/crust/v1"
	"crust.dev/crust/internal/katadir"
	"crust.dev/crust/internal/manager"
	"crust.dev/crust/internal/store"
	"crust.dev/crust/internal/validate"
)

// TestListProblemsIsBounded: past 1000 problems the answer holds the first 1000 and counts the rest, so
// that it always fits a gRPC message.
func TestListProblemsIsBounded(t *testing.T) {
	root := t.TempDir()
	state := filepath.Join(root, "state")
	if err := os.MkdirAll(filepath.Join(state, "volumes"), 0o700); err != nil {
		t.Fatal(err)
	}
	const n = problemsMax + 5
	for i := range n {
		if err := os.WriteFile(filepath.Join(state, "volumes", fmt.Sprintf("%064x.json", i)), []byte("{torn"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, loaded, err := store.Open(state, "boot-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	proj, err := katadir.New(filepath.Join(root, "kata"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := validate.New(validate.Config{KubeletDir: root})
	if err != nil {
		t.Fatal(err)
	}
	k := katadir.NewAdapter(proj, nil, nil)
	m, err := manager.Open(manager.Config{Validator: v, Store: st, Subscribers: []manager.Subscriber{k}, Claims: k, KubeletDir: root},
		manager.Loaded(*loaded))
	if err != nil {
		t.Fatal(err)
	}
	r, err := (&volumes{m: m}).ListProblems(context.Background(), &crustv1.ListProblemsRequest{})
	if err != nil || len(r.GetProblems()) != problemsMax || r.GetOmitted() != n-problemsMax {
		t.Fatalf("%d problems, %d omitted, %v; want %d and %d", len(r.GetProblems()), r.GetOmitted(), err, problemsMax, n-problemsMax)
	}
}
