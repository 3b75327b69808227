package agentproto

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrLineTooLong is returned for a line over MaxLineBytes.
var ErrLineTooLong = errors.New("agentproto: line too long")

// LineReader reads the protocol's lines with a bound on their length.
type LineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewLineReader returns a LineReader over r refusing lines longer than limit
// bytes (newline included); limit <= 0 means MaxLineBytes.
func NewLineReader(r io.Reader, limit int) *LineReader {
	if limit <= 0 {
		limit = MaxLineBytes
	}
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10), max: limit}
}

// ReadLine returns the next line without its newline. The slice is valid
// until the next call. A line over the bound is consumed up to its newline
// and reported as ErrLineTooLong; the next call returns the line after it.
// A last line without a newline is returned with io.EOF left for the next
// call only if it fits the bound.
func (l *LineReader) ReadLine() ([]byte, error) {
	l.buf = l.buf[:0]
	tooLong := false
	for {
		chunk, err := l.r.ReadSlice('\n')
		if !tooLong {
			if len(l.buf)+len(chunk) > l.max {
				tooLong = true
				l.buf = l.buf[:0]
			} else {
				l.buf = append(l.buf, chunk...)
			}
		}
		switch {
		case err == nil:
			if tooLong {
				return nil, ErrLineTooLong
			}
			return l.buf[:len(l.buf)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(l.buf) > 0 && !tooLong:
			return l.buf, nil
		default:
			return nil, err
		}
	}
}

// DecodeRequest parses one request line. It requires exactly one JSON object
// with a non-zero id and an op.
func DecodeRequest(line []byte) (Request, error) {
	var req Request
	if err := decodeOne(line, &req); err != nil {
		return Request{}, err
	}
	if req.ID == 0 {
		return Request{}, errors.New("agentproto: request without id")
	}
	if req.Op == "" {
		return Request{}, errors.New("agentproto: request without op")
	}
	return req, nil
}

// DecodeResponse parses one response line. It requires exactly one JSON
// object; a response with id 0 answers a line the peer could not parse.
func DecodeResponse(line []byte) (Response, error) {
	var resp Response
	if err := decodeOne(line, &resp); err != nil {
		return Response{}, err
	}
	return resp, nil
}

func decodeOne(line []byte, v any) error {
	if len(line) >= MaxLineBytes {
		return ErrLineTooLong
	}
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return errors.New("agentproto: line is not a JSON object")
	}
	// json.Unmarshal refuses trailing data, so a line holds one document.
	if err := json.Unmarshal(trimmed, v); err != nil {
		return fmt.Errorf("agentproto: %w", err)
	}
	return nil
}

// EncodeLine returns v as one protocol line, newline included, or an error
// when it would exceed MaxLineBytes.
func EncodeLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("agentproto: %w", err)
	}
	if len(b)+1 > MaxLineBytes {
		return nil, ErrLineTooLong
	}
	return append(b, '\n'), nil
}
