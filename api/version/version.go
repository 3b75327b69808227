// Package version is the one version of crust's binaries, stamped at build time, and what every crust
// program and gRPC client reports of it.
//
// The Makefile and the image builder stamp it with
//
//	go build -ldflags "-X crust.dev/crust/api/version.version=v0.2.0" ./cmd/...
//
// An unstamped build reports "devel" (or, when crust is linked into another program as a module, that
// module's version) together with the VCS revision Go recorded at build time. It lives in a package of its
// own, apart from the command-line plumbing (pkg/command), so that api/client can put it into its user
// agent without linking a CLI library into every CSI driver.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
)

// version is set with -ldflags -X; empty means not stamped.
var version string

// modulePath is crust's Go module.
const modulePath = "crust.dev/crust"

// Info is what a binary says about its build.
type Info struct {
	// Version is the stamped version; "devel" when the build was not stamped (or, when crust is a
	// dependency of another module, that dependency's version).
	Version string
	// Revision is the VCS revision the binary was built from, with "-dirty" when the tree had changes;
	// "unknown" when Go recorded none (go run, a test binary, -buildvcs=false).
	Revision string
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}

var get = sync.OnceValue(func() Info { return resolve(version, readBuildInfo()) })

func readBuildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}

// resolve computes Info from the stamped version and the build information Go recorded (nil: none).
func resolve(stamped string, bi *debug.BuildInfo) Info {
	in := Info{Version: stamped, Revision: "unknown", GoVersion: runtime.Version()}
	if bi == nil {
		if in.Version == "" {
			in.Version = "devel"
		}
		return in
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if !ownModule(bi.Main.Path) {
		// crust is linked into another program: the revision Go recorded is that program's, and the
		// version of crust is the one its go.mod required.
		rev = ""
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				if d.Replace != nil {
					d = d.Replace
				}
				if in.Version == "" && d.Version != "" {
					in.Version = d.Version
				}
			}
		}
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	if rev != "" {
		if dirty {
			rev += "-dirty"
		}
		in.Revision = rev
	}
	return in
}

// ownModule reports whether path is crust's module or a module of crust's own repository (its examples):
// only that repository publishes under crust's path, so the revision Go recorded for it is crust's.
func ownModule(path string) bool {
	return path == modulePath || strings.HasPrefix(path, modulePath+"/")
}

// Get returns this binary's build information. It is computed once.
func Get() Info { return get() }

// String is the one-line form every --version prints: "v0.2.0 (revision 1a2b3c…, go1.26.0)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}

// UserAgent is what crust's gRPC clients send (grpc.WithUserAgent; gRPC appends its own): "crust/VERSION".
func UserAgent() string { return "crust/" + Get().Version }
