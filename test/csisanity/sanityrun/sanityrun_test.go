package sanityrun

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"crust.dev/crust/internal/testutil/harness"
)

// csiTest is the module csi-sanity is built from; tools/csisanity/go.mod pins its version.
const csiTest = "github.com/kubernetes-csi/csi-test/v5"

// TestPinnedConnectSeesReady fails when tools/csisanity pins a csi-test older than v5.5.0. Before v5.5.0,
// the connect csi-sanity makes before its first test (utils.Connect) read the connection's state after
// grpc.Dial had started connecting and then waited for that state to change. A connection to a local
// socket can be READY by that read; READY then never changed, and the test failed after a minute with
// "Connection timed out", whichever endpoint it ran against and however fast it answered. From v5.5.0 the
// state is read before each wait.
func TestPinnedConnectSeesReady(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(harness.ModuleRoot(t), "tools", "csisanity", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	v := required(string(b), csiTest)
	if v == "" {
		t.Fatalf("tools/csisanity/go.mod requires no %s", csiTest)
	}
	var minor int
	if _, err := fmt.Sscanf(v, "v5.%d.", &minor); err != nil {
		t.Fatalf("%s %s: not a v5 version: %v", csiTest, v, err)
	}
	if minor < 5 {
		t.Errorf("tools/csisanity pins %s %s: its connect misses a connection that is READY at once, and "+
			"csi-sanity's first test then fails with \"Connection timed out\" now and then; pin v5.5.0 or later", csiTest, v)
	}
}

// required returns the version go.mod text requires of module path, "" when it requires none.
func required(gomod, path string) string {
	for _, line := range strings.Split(gomod, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == path {
			return f[1]
		}
	}
	return ""
}
