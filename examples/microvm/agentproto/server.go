package agentproto

import (
	"context"
	"errors"
	"io"
	"sync"
)

// Handler serves one request. A returned *Error reaches the host as is; any
// other error is answered as CodeInternal. The result (nil for none) is
// encoded as the response's result.
type Handler func(ctx context.Context, req Request) (any, error)

// Server is the agent side of the protocol. One Server may Serve several
// connections one after the other (the port is reopened when the host
// reconnects); writes of all of them are serialised.
type Server struct {
	Handler Handler

	wmu sync.Mutex
}

// Serve reads requests from r until it fails (io.EOF when the host went away)
// and answers each on w from its own goroutine, so a slow request does not
// hold up the others. Requests still running when Serve returns answer on w
// when they finish. Serve returns the read error.
func (s *Server) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	lr := NewLineReader(r, MaxLineBytes)
	for {
		line, err := lr.ReadLine()
		if errors.Is(err, ErrLineTooLong) {
			s.reply(w, Response{Error: Errorf(CodeInvalidArgument, "line longer than %d bytes", MaxLineBytes)})
			continue
		}
		if err != nil {
			return err
		}
		req, err := DecodeRequest(line)
		if err != nil {
			s.reply(w, Response{Error: Errorf(CodeInvalidArgument, "%v", err)})
			continue
		}
		go s.handle(ctx, w, req)
	}
}

func (s *Server) handle(ctx context.Context, w io.Writer, req Request) {
	resp := Response{ID: req.ID}
	result, err := s.Handler(ctx, req)
	if err != nil {
		var perr *Error
		if !errors.As(err, &perr) {
			perr = &Error{Code: CodeInternal, Message: err.Error()}
		}
		resp.Error = perr
	} else if result != nil {
		line, lerr := EncodeLine(result)
		if lerr != nil {
			resp.Error = Errorf(CodeInternal, "result: %v", lerr)
		} else {
			resp.Result = line[:len(line)-1]
		}
	}
	s.reply(w, resp)
}

func (s *Server) reply(w io.Writer, resp Response) {
	line, err := EncodeLine(resp)
	if err != nil {
		line, _ = EncodeLine(Response{ID: resp.ID, Error: Errorf(CodeInternal, "response: %v", err)})
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, _ = w.Write(line)
}
