package testutil

import (
	"os"
	"testing"
)

// RequireRoot skips the test unless it runs as root, saying why it needs root ("to chown").
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root " + why)
	}
}
