// Package e2estorage is the test binary make test-images builds as e2e.test: Kubernetes' end-to-end
// suite of the cluster's release with only the specs the cluster tier runs, the External Storage suite
// (storage/external, which takes --storage.testdriver), and the framework's flags and set-up. The
// release's own e2e.test links every suite, which a fresh machine spent about 2 CPU-minutes more
// compiling. hack/cluster/build.sh copies this file into its consumer module of Kubernetes and builds it
// there; as it lies under testdata, crust's own modules never build it.
package e2estorage

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	manifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	"k8s.io/kubernetes/test/fixtures"

	// The feature labels, defined before any suite uses them.
	_ "k8s.io/kubernetes/test/e2e/feature"
	// The suite.
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	// The framework's hooks that the release's binary installs too: what a failure dumps, the metrics
	// gathered around the suite, the node checks before it, and how objects are printed.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "e2e.test: arguments after the flags: %q\n", flag.Args())
		os.Exit(2)
	}
	// Files the specs read come from the binary when no --repo-root is given.
	testfiles.AddFileSource(manifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(fixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	if framework.TestContext.RepoRoot != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: framework.TestContext.RepoRoot})
	}
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
