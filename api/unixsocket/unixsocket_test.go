package unixsocket

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "sub", "s.sock")
	l, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket %v, %v; want a 0600 socket", fi.Mode(), err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	if _, err := Listen(sock); err == nil || !strings.Contains(err.Error(), "serving") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	_ = l.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after Close: %v", err)
	}

	// A stale socket (its listener gone without unlinking) is replaced.
	raw, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	raw.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = raw.Close()
	l, err = Listen(sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	_ = l.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil {
		t.Fatal("a regular file was replaced by a socket")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("the regular file was touched")
	}
}

// The socket is born 0600: bind, before any chmod, already creates it so, even under an umask that lets
// every bit through. (The test changes its own process's umask to prove that; Listen never does.)
func TestBornWithMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := bind(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket right after bind: %v, %v; want mode 0600", fi.Mode(), err)
	}
}

// An umask narrower than 0600 is widened back to exactly 0600.
func TestNarrowUmask(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock") // made before the umask would keep a non-root test out of it
	old := syscall.Umask(0o277)
	defer syscall.Umask(old)
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v; want mode 0600", fi.Mode(), err)
	}
}
