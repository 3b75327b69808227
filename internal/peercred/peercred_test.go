package peercred_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"crust.dev/crust/internal/peercred"
	"crust.dev/crust/internal/testutil"
)

// childSocketEnv, when set, makes TestChildClient act as the client process of TestServerSeesCaller.
const childSocketEnv = "PEERCRED_TEST_CHILD_SOCKET"

const childUID, childGID = 1000, 1000

type seen struct {
	cred unix.Ucred
	ok   bool
}

// TestServerSeesCaller runs a real gRPC server on a unix socket with New's credentials and checks, with
// an interceptor, who it sees: this process (uid 0) for a call made here, and uid/gid 1000 with the
// child's pid for a call made by a copy of this test binary run as uid 1000.
func TestServerSeesCaller(t *testing.T) {
	testutil.RequireRoot(t, "to run a client as another uid")
	// A directory uid 1000 can reach (t.TempDir's parent is 0700).
	dir, err := os.MkdirTemp("", "peercred-test-")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o777))
	sock := dir + "/crust.sock"

	seenc := make(chan seen, 4)
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		cred, ok := peercred.FromContext(ctx)
		seenc <- seen{cred, ok}
		if err := grpc.SetHeader(ctx, metadata.Pairs("x-peer-uid", strconv.FormatUint(uint64(cred.Uid), 10))); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.Creds(peercred.New()), grpc.UnaryInterceptor(record))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("unix", sock)
	must(t, err)
	must(t, os.Chmod(sock, 0o777))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// This process, through peercred on the client side too: each side sees the other (both are us).
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(peercred.New()))
	must(t, err)
	closeLater(t, conn)
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	want := unix.Ucred{Pid: int32(os.Getpid()), Uid: 0, Gid: uint32(os.Getgid())}
	if s := <-seenc; !s.ok || s.cred != want {
		t.Errorf("server saw %+v (ok %v) for this process, want %+v", s.cred, s.ok, want)
	}
	if ai, ok := p.AuthInfo.(peercred.AuthInfo); !ok || ai.Err != nil || ai.Ucred != want {
		t.Errorf("client saw %#v for the server, want %+v", p.AuthInfo, want)
	} else if ai.SecurityLevel != credentials.PrivacyAndIntegrity {
		t.Errorf("security level %v", ai.SecurityLevel)
	}

	// A child as uid 1000, with plain insecure client credentials. It runs a copy of this binary: the
	// go-build directory holding the original is 0700.
	exe := dir + "/peercred.test"
	copyFile(t, exe)
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestChildClient$", "-test.v")
	cmd.Dir = dir
	cmd.Env = []string{childSocketEnv + "=" + sock, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: childUID, Gid: childGID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want = unix.Ucred{Pid: int32(cmd.Process.Pid), Uid: childUID, Gid: childGID}
	select {
	case s := <-seenc:
		if !s.ok || s.cred != want {
			t.Errorf("server saw %+v (ok %v) for the child, want %+v", s.cred, s.ok, want)
		}
	default:
		t.Fatalf("the server saw no call from the child\n%s", out)
	}
	if !strings.Contains(string(out), "server saw uid 1000") {
		t.Errorf("child output lacks the uid the server reported:\n%s", out)
	}
}

// TestChildClient is the client process of TestServerSeesCaller; on its own it does nothing.
func TestChildClient(t *testing.T) {
	sock := os.Getenv(childSocketEnv)
	if sock == "" {
		t.Skip("runs only as TestServerSeesCaller's child")
	}
	if os.Getuid() != childUID || os.Getgid() != childGID {
		t.Fatalf("running as %d:%d", os.Getuid(), os.Getgid())
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	closeLater(t, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var md metadata.MD
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	fmt.Printf("server saw uid %s\n", strings.Join(md.Get("x-peer-uid"), ","))
}

func TestHandshakeOnSocketpair(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		conns[i], err = net.FileConn(f)
		must(t, f.Close())
		must(t, err)
		closeLater(t, conns[i])
	}
	got, ai, err := peercred.New().ServerHandshake(conns[0])
	if err != nil || got != conns[0] {
		t.Fatalf("ServerHandshake = %v, %v; want the same conn and no error", got, err)
	}
	want := unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if a, ok := ai.(peercred.AuthInfo); !ok || a.Err != nil || a.Ucred != want || a.AuthType() != "peercred" {
		t.Errorf("AuthInfo = %#v, want Ucred %+v", ai, want)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: ai})
	if cred, ok := peercred.FromContext(ctx); !ok || cred != want {
		t.Errorf("FromContext = %+v, %v", cred, ok)
	}
}

// TestHandshakeWithoutCredentials checks that a connection whose credentials cannot be read is accepted
// without them, and that FromContext then reports an unknown caller.
func TestHandshakeWithoutCredentials(t *testing.T) {
	pipe, other := net.Pipe()
	closeLater(t, pipe)
	closeLater(t, other)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	closeLater(t, lis)
	go func() {
		if c, err := net.Dial("tcp", lis.Addr().String()); err == nil {
			_, _ = io.Copy(io.Discard, c) // until the test closes its end
			_ = c.Close()
		}
	}()
	tcp, err := lis.Accept()
	must(t, err)
	closeLater(t, tcp)

	for name, conn := range map[string]net.Conn{"pipe": pipe, "tcp": tcp} {
		t.Run(name, func(t *testing.T) {
			got, ai, err := peercred.New().ServerHandshake(conn)
			if err != nil || got != conn {
				t.Fatalf("ServerHandshake = %v, %v; want the same conn and no error", got, err)
			}
			a, ok := ai.(peercred.AuthInfo)
			if !ok || a.Err == nil || !strings.Contains(a.Err.Error(), "not a unix socket") ||
				a.SecurityLevel != credentials.NoSecurity {
				t.Errorf("AuthInfo = %#v, want Err about a non-unix socket and NoSecurity", ai)
			}
			ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: ai})
			if cred, ok := peercred.FromContext(ctx); ok {
				t.Errorf("FromContext = %+v, true; want false", cred)
			}
		})
	}
}

type otherAuth struct{}

func (otherAuth) AuthType() string { return "other" }

func TestFromContextWithoutPeercred(t *testing.T) {
	for name, ctx := range map[string]context.Context{
		"no peer":          context.Background(),
		"no auth info":     peer.NewContext(context.Background(), &peer.Peer{}),
		"other auth info":  peer.NewContext(context.Background(), &peer.Peer{AuthInfo: otherAuth{}}),
		"pointer AuthInfo": peer.NewContext(context.Background(), &peer.Peer{AuthInfo: &peercred.AuthInfo{}}),
	} {
		if cred, ok := peercred.FromContext(ctx); ok {
			t.Errorf("%s: FromContext = %+v, true; want false", name, cred)
		}
	}
}

func TestPolicy(t *testing.T) {
	p := peercred.Policy{UIDs: []uint32{0, 1001}, GIDs: []uint32{2000}}
	tests := []struct {
		name   string
		policy peercred.Policy
		cred   unix.Ucred
		want   bool
	}{
		{"uid listed", p, unix.Ucred{Uid: 0, Gid: 0}, true},
		{"other uid listed", p, unix.Ucred{Uid: 1001, Gid: 1001}, true},
		{"gid listed", p, unix.Ucred{Uid: 1000, Gid: 2000}, true},
		{"neither listed", p, unix.Ucred{Uid: 1000, Gid: 1000}, false},
		{"uid in GIDs only", p, unix.Ucred{Uid: 2000, Gid: 1000}, false},
		{"gid in UIDs only", p, unix.Ucred{Uid: 1000, Gid: 1001}, false},
		{"unknown ids", p, unix.Ucred{Uid: ^uint32(0), Gid: ^uint32(0)}, false},
		{"zero policy allows nobody, not even root", peercred.Policy{}, unix.Ucred{}, false},
	}
	for _, tc := range tests {
		if got := tc.policy.Allowed(tc.cred); got != tc.want {
			t.Errorf("%s: Allowed(%+v) = %v, want %v", tc.name, tc.cred, got, tc.want)
		}
	}
}

// copyFile copies the running test binary to dst, executable by anyone.
func copyFile(t *testing.T, dst string) {
	t.Helper()
	src, err := os.Executable()
	must(t, err)
	in, err := os.Open(src)
	must(t, err)
	closeLater(t, in)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	must(t, err)
	_, err = io.Copy(out, in)
	must(t, err)
	must(t, out.Close())
}

// closeLater closes c when the test ends; the error does not matter there.
func closeLater(t *testing.T, c io.Closer) {
	t.Cleanup(func() { _ = c.Close() })
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
