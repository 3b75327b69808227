// Package arch checks the tree against the rules docs/architecture.md states: package names, the parts it
// and the README's Layout name, and that the linter enforces the import rules.
package arch

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"crust.dev/crust/internal/testutil"
)

// root is the repository's root.
func root(*testing.T) string { return testutil.RepoDir }

// modules are the Go modules go.work ties (Makefile's MODULES).
var modules = []string{"api", ".", "examples/lvm-csi", "examples/microvm", "test"}

type pkg struct {
	Dir, ImportPath, Name string
	GoFiles               []string
}

// packages lists every package of every module.
func packages(t *testing.T) []pkg {
	t.Helper()
	args := []string{"list", "-json=Dir,ImportPath,Name,GoFiles"}
	for _, m := range modules {
		args = append(args, "./"+filepath.Join(m, "..."))
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	for d := json.NewDecoder(strings.NewReader(string(out))); ; {
		var p pkg
		if err := d.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 50 {
		t.Fatalf("go list found %d packages; the tree has more", len(pkgs))
	}
	return pkgs
}

var versioned = regexp.MustCompile(`^v[0-9]+$`)

// Every package is named as its folder (a versioned folder, crust/v1, as its parent and version:
// crustv1), and no two packages share a name, so that no import needs an alias. Commands and folders
// of tests alone are not packages anyone imports.
func TestPackageNames(t *testing.T) {
	byName := map[string]string{}
	for _, p := range packages(t) {
		if p.Name == "main" || len(p.GoFiles) == 0 {
			continue
		}
		want := filepath.Base(p.Dir)
		if versioned.MatchString(want) {
			want = filepath.Base(filepath.Dir(p.Dir)) + want
		}
		if p.Name != want {
			t.Errorf("%s is package %s; its folder says %s", p.ImportPath, p.Name, want)
		}
		if other, ok := byName[p.Name]; ok {
			t.Errorf("%s and %s are both package %s", other, p.ImportPath, p.Name)
		}
		byName[p.Name] = p.ImportPath
	}
}

// read returns a file of the repository.
func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of markdown file name from the heading head to the next heading of its level.
func section(t *testing.T, name, head string) string {
	t.Helper()
	text := read(t, name)
	_, rest, ok := strings.Cut(text, "\n"+head+"\n")
	if !ok {
		t.Fatalf("%s has no %q", name, head)
	}
	level := strings.SplitN(head, " ", 2)[0] + " "
	if i := strings.Index(rest, "\n"+level); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// parts are the folders whose every package the docs name: the API module's, pkg/'s and internal/'s.
func parts(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"api", "pkg", "internal"} {
		entries, err := os.ReadDir(filepath.Join(root(t), dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() && e.Name() != "releases" && e.Name() != "proto" {
				out = append(out, dir+"/"+e.Name())
			}
		}
	}
	return out
}

// docs/architecture.md's parts table names folders that exist, and names every part of the tree; so does
// the README's Layout.
func TestDocsNameTheTree(t *testing.T) {
	table := section(t, "docs/architecture.md", "## The parts")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9/_.-]*)`").FindAllStringSubmatch(table, -1) {
		p := strings.TrimSuffix(m[1], "/")
		if !strings.HasPrefix(p, "api") && !strings.HasPrefix(p, "pkg/") && !strings.HasPrefix(p, "internal/") &&
			!strings.HasPrefix(p, "cmd/") && !strings.HasPrefix(p, "examples/") {
			continue // a flag, a type or a value
		}
		p = regexp.MustCompile(`\.[A-Z]\w*$`).ReplaceAllString(p, "") // pkg/command.CallLog
		if _, err := os.Stat(filepath.Join(root(t), p)); err != nil {
			t.Errorf("docs/architecture.md's parts table names %s, which is not in the tree", p)
		}
		for ; p != "." && p != "/"; p = filepath.Dir(p) {
			named[p] = true // api/crust/v1 names api/crust too
		}
	}
	layout := section(t, "README.md", "## Layout")
	for _, p := range parts(t) {
		if !named[p] {
			t.Errorf("docs/architecture.md's parts table does not name %s", p)
		}
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(filepath.Base(p)) + `\b`).MatchString(layout) {
			t.Errorf("the README's Layout does not name %s", p)
		}
	}
}

// The linter fails a change that breaks an import rule of docs/architecture.md or builds a gRPC status
// outside errdefs: a module laid out as crust's, with one of each, is linted with crust's configuration.
func TestLintEnforcesTheRules(t *testing.T) {
	if testing.Short() {
		t.Skip("runs golangci-lint")
	}
	dir := t.TempDir()
	// The modules go.work selects, and their sums: the linter reads the module cache only, filled first
	// by a go list of the module's packages (with the network, as any build of the tree), so that the
	// test holds alone on a new machine too.
	files := map[string]string{
		"go.mod":                 "module crust.dev/crust\n\ngo 1.26.0\n\nrequire (\n" + workspaceModules(t) + ")\n",
		"go.sum":                 sums(t),
		"internal/daemon/d.go":   "// Package daemon is crustd.\npackage daemon\n\n// Run runs it.\nfunc Run() {}\n",
		"pkg/thing/thing.go":     "// Package thing breaks a rule.\npackage thing\n\nimport \"crust.dev/crust/internal/daemon\"\n\n// Do does.\nfunc Do() { daemon.Run() }\n",
		"internal/server/s.go":   "// Package server breaks a rule.\npackage server\n\nimport (\n\t\"google.golang.org/grpc/codes\"\n\t\"google.golang.org/grpc/status\"\n)\n\n// Deny denies.\nfunc Deny() error { return status.Error(codes.PermissionDenied, \"no\") }\n",
		"internal/csiproxy/p.go": "// Package csiproxy breaks a rule.\npackage csiproxy\n\nimport \"crust.dev/crust/internal/daemon\"\n\n// Do does.\nfunc Do() { daemon.Run() }\n",
		"internal/server/ok.go":  "package server\n\nimport \"errors\"\n\n// ErrX is fine.\nvar ErrX = errors.New(\"x\")\n",
		".golangci.yml":          read(t, ".golangci.yml"),
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	fill := exec.Command("go", "list", "-deps", "./...")
	fill.Dir, fill.Env = dir, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := fill.CombinedOutput(); err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	// The linter as make lint builds it (pinned in tools/lint), run on the module from the module cache.
	tool := exec.Command("go", "tool", "-modfile="+filepath.Join(root(t), "tools", "lint", "go.mod"), "-n", "golangci-lint")
	tool.Env = append(os.Environ(), "GOWORK=off")
	bin, err := tool.Output()
	if err != nil {
		t.Fatalf("building golangci-lint: %v", err)
	}
	lint := exec.Command(strings.TrimSpace(string(bin)), "run",
		"--allow-parallel-runners", "--max-issues-per-linter=0", "--max-same-issues=0", "./...")
	lint.Dir, lint.Env = dir, append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off")
	out, err := lint.CombinedOutput()
	if err == nil {
		t.Fatalf("golangci-lint passed a module that breaks the rules:\n%s", out)
	}
	for _, want := range []string{
		"pkg/thing/thing.go:4:8: import 'crust.dev/crust/internal/daemon' is not allowed from list 'pkg'",
		"internal/csiproxy/p.go:4:8: import 'crust.dev/crust/internal/daemon' is not allowed from list 'proxy'",
		"internal/server/s.go:5:2: import 'google.golang.org/grpc/codes' is not allowed from list 'status'",
		"internal/server/s.go:6:2: import 'google.golang.org/grpc/status' is not allowed from list 'status'",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("golangci-lint did not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "ok.go") {
		t.Errorf("golangci-lint found fault with the file that breaks no rule:\n%s", out)
	}
}

// workspaceModules are the modules go.work selects, as go.mod require lines (crust's own left out).
func workspaceModules(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{if not .Main}}{{.Path}} {{.Version}}{{end}}", "all")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" && !strings.HasPrefix(line, "crust.dev/") {
			b.WriteString("\t" + line + "\n")
		}
	}
	return b.String()
}

// sums are every go.sum line of the workspace.
func sums(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, m := range modules {
		b.WriteString(read(t, filepath.Join(m, "go.sum")))
	}
	b.WriteString(read(t, "go.work.sum"))
	return b.String()
}
