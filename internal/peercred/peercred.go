// Package peercred tells a gRPC server on a unix socket who its caller is: the uid, gid and pid the
// kernel recorded for the peer process (SO_PEERCRED) when it connected.
//
// Use New as the server's transport credentials, then, in an interceptor, FromContext for the caller and
// a Policy to decide:
//
//	srv := grpc.NewServer(grpc.Creds(peercred.New()), grpc.UnaryInterceptor(...))
//	cred, ok := peercred.FromContext(ctx)
//	if !ok || !policy.Allowed(cred) { /* PERMISSION_DENIED */ }
//
// The handshake never fails: a connection whose credentials cannot be read is accepted without them, so
// that its calls can be refused with a proper status instead of a broken connection.
package peercred

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// AuthType is what AuthInfo.AuthType returns.
const AuthType = "peercred"

// AuthInfo is the credentials.AuthInfo of a connection made with New's credentials.
type AuthInfo struct {
	credentials.CommonAuthInfo
	// Ucred is the peer's pid, uid and gid as the kernel recorded them when the connection was made
	// (connect(2) or socketpair(2)); they do not follow later changes, and the pid may since have been
	// reused. Meaningful only when Err is nil.
	Ucred unix.Ucred
	// Err says why Ucred could not be read (the connection is not a unix socket, or getsockopt failed);
	// nil when it was.
	Err error
}

var _ credentials.AuthInfo = AuthInfo{}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return AuthType }

// New returns transport credentials for a unix socket, for a server (grpc.Creds) or a client
// (grpc.WithTransportCredentials). The handshake reads SO_PEERCRED and returns an AuthInfo; it never
// fails and never changes the connection's bytes. A client learns the server's credentials the same way
// (through grpc.Peer).
//
// They add no encryption: a unix socket's bytes go through the kernel only. A connection whose
// credentials were read reports the security level PrivacyAndIntegrity, as gRPC's local credentials do for
// unix sockets; any other reports NoSecurity.
func New() credentials.TransportCredentials { return creds{} }

type creds struct{}

func (creds) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, authInfo(conn), nil
}

func (creds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return conn, authInfo(conn), nil
}

func (creds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: AuthType}
}

func (c creds) Clone() credentials.TransportCredentials { return c }

// OverrideServerName is unused by gRPC; there is no server name to check.
func (creds) OverrideServerName(string) error { return nil }

func authInfo(conn net.Conn) AuthInfo {
	cred, err := read(conn)
	if err != nil {
		return AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, Err: err}
	}
	return AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		Ucred: cred}
}

// read returns SO_PEERCRED of a unix socket connection.
func read(conn net.Conn) (unix.Ucred, error) {
	if _, ok := conn.LocalAddr().(*net.UnixAddr); !ok {
		// SO_PEERCRED on another kind of socket gives uid and gid -1 rather than an error.
		return unix.Ucred{}, fmt.Errorf("peercred: %s connection is not a unix socket", conn.LocalAddr().Network())
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return unix.Ucred{}, fmt.Errorf("peercred: %T gives no access to its socket", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return unix.Ucred{}, fmt.Errorf("peercred: %w", err)
	}
	var cred *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return unix.Ucred{}, fmt.Errorf("peercred: %w", err)
	}
	if gerr != nil {
		return unix.Ucred{}, fmt.Errorf("peercred: SO_PEERCRED: %w", gerr)
	}
	if cred == nil {
		return unix.Ucred{}, errors.New("peercred: SO_PEERCRED returned nothing")
	}
	return *cred, nil
}

// FromContext returns the credentials of the peer of the call ctx belongs to (on a server, the caller).
// It reports false when the connection was not made with New's credentials or its credentials could not
// be read; such a caller must be treated as unknown.
func FromContext(ctx context.Context) (unix.Ucred, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return unix.Ucred{}, false
	}
	ai, ok := p.AuthInfo.(AuthInfo)
	if !ok || ai.Err != nil {
		return unix.Ucred{}, false
	}
	return ai.Ucred, true
}

// Policy is an allow-list of callers. The zero Policy allows nobody.
type Policy struct {
	// UIDs are allowed user ids.
	UIDs []uint32
	// GIDs are allowed group ids, matched against the peer's primary gid only (SO_PEERCRED carries no
	// supplementary groups).
	GIDs []uint32
}

// Allowed reports whether c's uid is in UIDs or its gid is in GIDs.
func (p Policy) Allowed(c unix.Ucred) bool {
	return slices.Contains(p.UIDs, c.Uid) || slices.Contains(p.GIDs, c.Gid)
}
