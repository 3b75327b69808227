//go:build linux

package guest

import (
	"context"
	"io"
	"sync"
)

// streamBuffer bounds what a stream keeps unread. When it is full the stream stops reading its pipe, so
// the process writing blocks as on a full pipe: output is never dropped.
const streamBuffer = 4 << 20

// stream keeps what a process writes to one of its outputs until ReadStream takes it.
type stream struct {
	mu      sync.Mutex
	buf     []byte
	eof     bool          // the source ended (or was closed): nothing more comes after buf
	changed chan struct{} // closed, and replaced, whenever buf or eof changes
}

// newStream starts copying r into a stream until r ends; r is closed then.
func newStream(r io.ReadCloser) *stream {
	s := &stream{changed: make(chan struct{})}
	go s.pump(r)
	return s
}

func (s *stream) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *stream) pump(r io.ReadCloser) {
	defer func() { _ = r.Close() }()
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		if n > 0 && !s.put(chunk[:n]) {
			return
		}
		if err != nil { // io.EOF; EIO from a terminal whose every holder closed it; or closed by discard
			s.mu.Lock()
			s.eof = true
			s.notify()
			s.mu.Unlock()
			return
		}
	}
}

// put appends b, waiting while the buffer is full; false when the stream was discarded meanwhile.
func (s *stream) put(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) > 0 && len(s.buf)+len(b) > streamBuffer && !s.eof {
		ch := s.changed
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	if s.eof {
		return false
	}
	s.buf = append(s.buf, b...)
	s.notify()
	return true
}

// read answers up to limit bytes, waiting until there are some or the stream ended; eof is set when
// nothing is left after data and the source ended, which may come with the last data.
func (s *stream) read(ctx context.Context, limit int) (data []byte, eof bool, err error) {
	for {
		s.mu.Lock()
		if len(s.buf) > 0 || s.eof {
			n := min(limit, len(s.buf))
			data = append([]byte(nil), s.buf[:n]...)
			if n == len(s.buf) {
				s.buf = nil
			} else {
				s.buf = s.buf[n:]
			}
			eof = s.eof && len(s.buf) == 0
			s.notify() // room for the pump
			s.mu.Unlock()
			return data, eof, nil
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// discard drops what is unread and ends the stream; the pump stops at its next write.
func (s *stream) discard() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf, s.eof = nil, true
	s.notify()
}
