package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
)

// RandomHex returns n random bytes in hex: a value no disk, log or answer holds by chance, for a test
// that looks for where one went.
func RandomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
