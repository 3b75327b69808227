package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, tc := range []struct {
		name         string
		stamped      string
		bi           *debug.BuildInfo
		version, rev string
	}{
		{name: "no build info", version: "devel", rev: "unknown"},
		{name: "stamped, no build info", stamped: "v1.2.3", version: "v1.2.3", rev: "unknown"},
		{name: "crust, unstamped", bi: &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: modulePath}, Settings: vcs("abc", "false")},
			version: "devel", rev: "abc"},
		{name: "crust, stamped, dirty", stamped: "v0.2.0", bi: &debug.BuildInfo{Main: debug.Module{Path: modulePath}, Settings: vcs("abc", "true")},
			version: "v0.2.0", rev: "abc-dirty"},
		{name: "crust's example module, stamped", stamped: "v0.2.0", bi: &debug.BuildInfo{Main: debug.Module{Path: modulePath + "/examples/microvm"},
			Settings: vcs("abc", "false"), Deps: []*debug.Module{{Path: modulePath, Version: "(devel)"}}},
			version: "v0.2.0", rev: "abc"},
		{name: "crust's example module, unstamped", bi: &debug.BuildInfo{Main: debug.Module{Path: modulePath + "/examples/lvm-csi"},
			Settings: vcs("abc", "false"), Deps: []*debug.Module{{Path: modulePath, Version: "(devel)"}}},
			version: "devel", rev: "abc"},
		{name: "a module named like crust", bi: &debug.BuildInfo{Main: debug.Module{Path: modulePath + "acean/driver"}, Settings: vcs("driverrev", "false"),
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.3.0"}}},
			version: "v0.3.0", rev: "unknown"},
		{name: "crust without VCS", bi: &debug.BuildInfo{Main: debug.Module{Path: modulePath}}, version: "devel", rev: "unknown"},
		{name: "linked into a driver", bi: &debug.BuildInfo{Main: debug.Module{Path: "example.com/driver"}, Settings: vcs("driverrev", "false"),
			Deps: []*debug.Module{{Path: "google.golang.org/grpc", Version: "v1.70.0"}, {Path: modulePath, Version: "v0.3.0"}}},
			version: "v0.3.0", rev: "unknown"},
		{name: "linked, replaced", bi: &debug.BuildInfo{Main: debug.Module{Path: "example.com/driver"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v0.3.0", Replace: &debug.Module{Path: "../crust", Version: ""}}}},
			version: "devel", rev: "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.stamped, tc.bi)
			if got.Version != tc.version || got.Revision != tc.rev {
				t.Errorf("resolve = %+v, want version %q revision %q", got, tc.version, tc.rev)
			}
			if got.GoVersion == "" {
				t.Error("no Go version")
			}
			if tc.bi != nil && tc.bi.GoVersion != "" && got.GoVersion != tc.bi.GoVersion {
				t.Errorf("GoVersion %q, want %q", got.GoVersion, tc.bi.GoVersion)
			}
		})
	}
}

func TestStringAndUserAgent(t *testing.T) {
	i := Get()
	if s := i.String(); !strings.HasPrefix(s, i.Version+" (revision "+i.Revision+", ") {
		t.Errorf("String = %q", s)
	}
	if ua := UserAgent(); ua != "crust/"+i.Version {
		t.Errorf("UserAgent = %q", ua)
	}
}
