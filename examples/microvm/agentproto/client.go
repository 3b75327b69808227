package agentproto

import (
	"context"
	"net"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/examples/microvm/agentproto/agentv1"
)

// Client is the host's client of the agent over one session of the port. Its methods are safe for
// concurrent use; their errors are errdefs kinds (FromGRPC). A connection that ended fails every call
// with errdefs.ErrUnavailable.
type Client struct {
	agentv1.AgentServiceService
	conn *ttrpc.Client
	done chan struct{}
}

// Dial opens a session on the port through QEMU's unix socket at path (DialPort) and returns the
// agent's client on it, once the agent has accepted the session.
func Dial(ctx context.Context, path string) (*Client, error) {
	conn, err := DialPort(ctx, path)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	c := NewClient(conn, ttrpc.WithOnClose(func() { close(done) }))
	return &Client{AgentServiceService: agentv1.NewAgentServiceClient(c), conn: c, done: done}, nil
}

// NewClient returns a ttrpc client on conn, which it owns, that turns the status errors of its calls
// into errdefs kinds (FromGRPC).
func NewClient(conn net.Conn, opts ...ttrpc.ClientOpts) *ttrpc.Client {
	return ttrpc.NewClient(conn, append(opts, ttrpc.WithUnaryClientInterceptor(
		func(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, _ *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
			if err := invoke(ctx, req, resp); err != nil {
				return FromGRPC(err)
			}
			// ttrpc turns a status in the response into an error after the interceptors: take it here.
			if st := resp.Status; st != nil && st.GetCode() != int32(codes.OK) {
				resp.Status = nil
				return FromGRPC(status.ErrorProto(st))
			}
			return nil
		}))...)
}

// Done is closed when the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the connection; calls in flight and later ones fail.
func (c *Client) Close() error { return c.conn.Close() }

// NewServer returns a ttrpc server whose handlers' errors reach the client as gRPC status (ToGRPC).
// Register services on it and serve a listener, such as ListenPort's.
func NewServer() (*ttrpc.Server, error) {
	return ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(
		func(ctx context.Context, unmarshal ttrpc.Unmarshaler, _ *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
			resp, err := method(ctx, unmarshal)
			return resp, ToGRPC(err)
		}))
}
