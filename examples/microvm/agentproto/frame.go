package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
)

// The port is a byte pipe that outlives the host's connections to it: bytes one connection wrote may
// still be in it, up to half a frame, when the next one starts, in either direction. So ttrpc's stream
// does not go on the port as it is: it is cut into frames that carry the session (the host connection)
// they belong to and checksums, and a reader drops whatever is not a whole frame of its own session.
//
//	magic "crs1" | kind (1 byte) | session (8, big-endian) | length (4) | crc32c of the 17 bytes before |
//	payload (length bytes, at most maxPayload) | crc32c of the payload
//
// A reader that finds no valid header at its position skips a byte and looks again, so it finds the next
// frame after any garbage. A frame's declared length is trusted only once its header checksum holds;
// whoever starts a session writes a pad of zero bytes at least as long as the longest frame first, so a
// reader left inside a cut frame reads the pad, finds the frame's checksum wrong and goes on from there
// without waiting for bytes that never come.

const (
	headerSize  = 4 + 1 + 8 + 4 + 4
	trailerSize = 4
	// maxPayload bounds one frame's payload; longer writes are cut into several frames.
	maxPayload = 16 << 10
	// maxFrame is the longest frame, and the length of a pad.
	maxFrame = headerSize + maxPayload + trailerSize
)

var magic = [4]byte{'c', 'r', 's', '1'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// kind says what a frame is.
type kind byte

const (
	// kindOpen starts session s (host to guest); sent again, it asks for the ack again.
	kindOpen kind = 1 + iota
	// kindAck accepts session s (guest to host).
	kindAck
	// kindHello says the guest has just opened its port (guest to host, session 0): an open sent
	// before may have been lost.
	kindHello
	// kindData carries bytes of session s's ttrpc stream.
	kindData
)

// frame is one decoded frame.
type frame struct {
	kind    kind
	session uint64
	payload []byte
}

// appendFrame appends the encoding of one frame to b; payload must be at most maxPayload bytes.
func appendFrame(b []byte, k kind, session uint64, payload []byte) []byte {
	start := len(b)
	b = append(b, magic[:]...)
	b = append(b, byte(k))
	b = binary.BigEndian.AppendUint64(b, session)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
	b = append(b, payload...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(payload, castagnoli))
}

// appendPad appends the zero bytes that start a session (see above).
func appendPad(b []byte) []byte { return append(b, make([]byte, maxFrame)...) }

// frameReader decodes frames from a byte stream, skipping whatever is not a whole valid frame.
type frameReader struct {
	r *bufio.Reader
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 2*maxFrame)}
}

// next returns the next valid frame; its payload is the caller's. It returns only the underlying
// reader's errors (io.EOF when it ended, or io.ErrUnexpectedEOF inside a frame).
func (fr *frameReader) next() (frame, error) {
	for {
		h, err := fr.r.Peek(headerSize)
		if err != nil {
			return frame{}, eof(err, len(h))
		}
		if !bytes.Equal(h[:4], magic[:]) {
			fr.skip()
			continue
		}
		length := binary.BigEndian.Uint32(h[13:17])
		k := kind(h[4])
		if binary.BigEndian.Uint32(h[17:21]) != crc32.Checksum(h[:17], castagnoli) ||
			length > maxPayload || k < kindOpen || k > kindData {
			_, _ = fr.r.Discard(1)
			continue
		}
		session := binary.BigEndian.Uint64(h[5:13])
		whole, err := fr.r.Peek(headerSize + int(length) + trailerSize)
		if err != nil {
			return frame{}, eof(err, len(whole))
		}
		payload := whole[headerSize : headerSize+int(length)]
		if binary.BigEndian.Uint32(whole[headerSize+int(length):]) != crc32.Checksum(payload, castagnoli) {
			_, _ = fr.r.Discard(1)
			continue
		}
		f := frame{kind: k, session: session, payload: bytes.Clone(payload)}
		_, _ = fr.r.Discard(len(whole))
		return f, nil
	}
}

// skip discards bytes up to the next one that may start a frame, at least one.
func (fr *frameReader) skip() {
	buf, _ := fr.r.Peek(fr.r.Buffered())
	n := len(buf)
	if i := bytes.IndexByte(buf[min(1, n):], magic[0]); i >= 0 {
		n = i + 1
	}
	_, _ = fr.r.Discard(max(n, 1))
}

func eof(err error, got int) error {
	if errors.Is(err, io.EOF) && got > 0 {
		return io.ErrUnexpectedEOF
	}
	return err
}
