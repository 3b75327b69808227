// Package api tests the API module (crust.dev/crust/api) as integrators take it: alone, from a module of
// their own.
package api

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/internal/testutil"
)

// apiDir is the API module's directory.
func apiDir(*testing.T) string { return filepath.Join(testutil.RepoDir, "api") }

// goCmd runs go in dir outside the workspace (as an integrator's module is) and returns its output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	// From the module cache only, nothing from the network: make deps downloads every module a tidy of
	// the API module reads, checked against its go.sum then.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		hint := ""
		if strings.Contains(string(out), "GOPROXY=off") {
			hint = "\n(a module is missing from the module cache: make deps downloads what a tidy of the API module reads)"
		}
		t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, hint)
	}
	return string(out)
}

// A driver and a runtime handler that import only the API module build in a module of their own whose
// go.mod lists none of the daemon's dependencies.
func TestModuleAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module from scratch")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/driver\n\ngo 1.25.0\n\nrequire crust.dev/crust/api v0.0.0\n\nreplace crust.dev/crust/api => " + apiDir(t) + "\n",
		"main.go": `package main

import (
	"context"
	"fmt"

	"crust.dev/crust/api/client"
	"crust.dev/crust/api/crustd"
	"crust.dev/crust/api/errdefs"
	"crust.dev/crust/api/handler"
	"crust.dev/crust/api/kata"
	"crust.dev/crust/api/volume"
)

func main() {
	c, err := client.New(crustd.SocketFromEnv(), client.WithDriverName("example.com"))
	if err != nil {
		panic(err)
	}
	held, err := c.Holds(context.Background(), "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount")
	fmt.Println(held, err, volume.DeferKey, errdefs.ErrNotFound, kata.VolumeDirName("/x"))
	h, err := handler.Dial(crustd.DefaultSocket)
	fmt.Println(h, err)
}
`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "build", "./...")
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mod), "\n") {
		for _, banned := range []string{"k8s.io/client-go", "k8s.io/apimachinery", "github.com/prometheus/", "github.com/spf13/cobra", "github.com/google/go-containerregistry", "crust.dev/crust "} {
			if strings.Contains(line, banned) {
				t.Errorf("the API module brings %s into a driver's module: its go.mod has %q", banned, strings.TrimSpace(line))
			}
		}
	}
	if t.Failed() {
		t.Logf("the driver's go.mod:\n%s", mod)
	}
}

// The handler library links no CLI library and no CSI: a runtime handler takes on neither.
func TestHandlerDeps(t *testing.T) {
	deps := goCmd(t, apiDir(t), "list", "-deps", "./handler")
	for _, banned := range []string{"github.com/spf13/cobra", "github.com/spf13/pflag", "github.com/container-storage-interface/spec"} {
		if strings.Contains(deps, banned) {
			t.Errorf("api/handler depends on %s", banned)
		}
	}
	if !strings.Contains(deps, "crust.dev/crust/api/crust/v1") {
		t.Errorf("go list -deps ./handler does not list the API's Go (crust.dev/crust/api/crust/v1): is the list empty?\n%s", deps)
	}
}
