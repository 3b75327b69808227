package agentproto

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Both ends of the port see it as a net.Conn for ttrpc: the host's through DialPort, one per connection
// to QEMU's socket; the guest's through ListenPort, one per session a host opened. Sessions and frames
// are described in frame.go.

// portAddr is the address of either end.
type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return PortName }

// writer writes whole frames of one session on the port, one Write call per frame, so that frames of
// concurrent writers never interleave.
type writer struct {
	mu      *sync.Mutex
	w       io.Writer
	session uint64
}

func (w writer) write(k kind, payload []byte, pad bool) error {
	var b []byte
	if pad {
		b = appendPad(b)
	}
	b = appendFrame(b, k, w.session, payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.w.Write(b)
	return err
}

// writeData writes p as data frames of at most maxPayload bytes each.
func (w writer) writeData(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxPayload)]
		if err := w.write(kindData, chunk, false); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// noDeadlines: a port end has no deadlines; ttrpc bounds calls with their contexts.
type noDeadlines struct{}

var errNoDeadline = errors.New("agentproto: the port has no deadlines; use a context")

func (noDeadlines) SetDeadline(time.Time) error      { return errNoDeadline }
func (noDeadlines) SetReadDeadline(time.Time) error  { return errNoDeadline }
func (noDeadlines) SetWriteDeadline(time.Time) error { return errNoDeadline }

// DialPort connects to the port through QEMU's unix socket at path and opens a new session on it; it
// returns once the agent has accepted the session, without polling: an open sent before the agent had its
// port open is sent again when the agent says it has (kindHello). Bytes of earlier sessions still in the
// port are dropped. The connection ends when ctx ends first.
func DialPort(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	sock, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	c := &hostConn{
		sock: sock,
		fr:   newFrameReader(sock),
		w:    writer{mu: new(sync.Mutex), w: sock, session: binary.BigEndian.Uint64(seed[:]) | 1},
	}
	stop := context.AfterFunc(ctx, func() { _ = sock.Close() })
	err = c.open()
	if !stop() || err != nil {
		_ = sock.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("agentproto: opening a session on %s: %w", path, err)
	}
	return c, nil
}

// hostConn is the host's end of one session.
type hostConn struct {
	noDeadlines
	sock net.Conn
	fr   *frameReader
	w    writer
	rest []byte // data read but not yet returned
}

func (c *hostConn) open() error {
	if err := c.w.write(kindOpen, nil, true); err != nil {
		return err
	}
	for {
		f, err := c.fr.next()
		if err != nil {
			return err
		}
		switch {
		case f.kind == kindAck && f.session == c.w.session:
			return nil
		case f.kind == kindHello:
			if err := c.w.write(kindOpen, nil, true); err != nil {
				return err
			}
		}
	}
}

// Read returns bytes of the session's stream. An agent that says hello again has restarted and forgotten
// the session: the stream has ended.
func (c *hostConn) Read(p []byte) (int, error) {
	for len(c.rest) == 0 {
		f, err := c.fr.next()
		if err != nil {
			return 0, err
		}
		switch {
		case f.kind == kindData && f.session == c.w.session:
			c.rest = f.payload
		case f.kind == kindHello:
			return 0, io.EOF
		}
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

func (c *hostConn) Write(p []byte) (int, error) { return c.w.writeData(p) }
func (c *hostConn) Close() error                { return c.sock.Close() }
func (c *hostConn) LocalAddr() net.Addr         { return portAddr{} }
func (c *hostConn) RemoteAddr() net.Addr        { return portAddr{} }

// ListenPort serves the guest's end of the port, which it owns from now on: it says hello, and Accept
// returns one connection for each session a host opens. Opening a new session ends the connection of
// the one before (its reads end with io.EOF, its writes fail), and frames of other sessions are dropped.
// Reads from port should block while no host is connected rather than report an end; a read error ends
// the listener, which closes port.
func ListenPort(port io.ReadWriteCloser) net.Listener {
	l := &portListener{port: port, fr: newFrameReader(port), wmu: new(sync.Mutex), conns: make(chan *guestConn), done: make(chan struct{})}
	go l.demux()
	return l
}

type portListener struct {
	port  io.ReadWriteCloser
	fr    *frameReader
	wmu   *sync.Mutex
	conns chan *guestConn
	done  chan struct{}
	once  sync.Once
	err   error // why demux ended, readable after done
}

func (l *portListener) demux() {
	var cur *guestConn
	// The hello goes first: writes may block until a host is connected, and nothing comes before.
	err := (writer{mu: l.wmu, w: l.port}).write(kindHello, nil, true)
	for err == nil {
		var f frame
		if f, err = l.fr.next(); err != nil {
			break
		}
		switch {
		case f.kind == kindOpen && (cur == nil || f.session != cur.w.session):
			if cur != nil {
				cur.end()
			}
			pr, pw := io.Pipe()
			cur = &guestConn{w: writer{mu: l.wmu, w: l.port, session: f.session}, pr: pr, pw: pw}
			if err = cur.w.write(kindAck, nil, true); err != nil {
				break
			}
			select {
			case l.conns <- cur:
			case <-l.done:
				return
			}
		case f.kind == kindOpen:
			err = cur.w.write(kindAck, nil, true)
		case f.kind == kindData && cur != nil && f.session == cur.w.session:
			// A pipe write blocks until the session reads it; one whose session ended fails, and
			// the frame is dropped.
			_, _ = cur.pw.Write(f.payload)
		}
		if err != nil {
			break
		}
	}
	if cur != nil {
		cur.end()
	}
	l.err = err
	l.once.Do(func() { close(l.done) })
	_ = l.port.Close()
}

func (l *portListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		if l.err != nil {
			return nil, fmt.Errorf("%w: %w", net.ErrClosed, l.err)
		}
		return nil, net.ErrClosed
	}
}

// Close ends the listener and the current session, and closes the port.
func (l *portListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.port.Close()
}

func (l *portListener) Addr() net.Addr { return portAddr{} }

// guestConn is the guest's end of one session.
type guestConn struct {
	noDeadlines
	w    writer
	pr   *io.PipeReader
	pw   *io.PipeWriter
	gone bool // under w.mu
}

// end ends the session: reads return io.EOF once the data already passed on is read, writes fail.
func (c *guestConn) end() {
	c.w.mu.Lock()
	c.gone = true
	c.w.mu.Unlock()
	_ = c.pw.Close()
}

func (c *guestConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

func (c *guestConn) Write(p []byte) (int, error) {
	c.w.mu.Lock()
	gone := c.gone
	c.w.mu.Unlock()
	if gone {
		return 0, net.ErrClosed
	}
	return c.w.writeData(p)
}

func (c *guestConn) Close() error {
	c.end()
	return c.pr.Close()
}

func (c *guestConn) LocalAddr() net.Addr  { return portAddr{} }
func (c *guestConn) RemoteAddr() net.Addr { return portAddr{} }
