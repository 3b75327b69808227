package server

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"crust.dev/crust/api/errdefs"
)

// requestCodec is the proto codec, except that a request that does not decode (a string that is not
// UTF-8, bytes that are not a protobuf message) is not refused inside gRPC, which would answer INTERNAL:
// it is remembered, and the interceptors answer INVALID_ARGUMENT naming the field, after the caller has
// been authorised. Every remembered request is taken back by take, so nothing accumulates.
type requestCodec struct {
	base encoding.CodecV2
	bad  sync.Map // request message -> error
}

func newRequestCodec() *requestCodec {
	return &requestCodec{base: encoding.GetCodecV2(protocodec.Name)}
}

func (c *requestCodec) Name() string { return protocodec.Name }

func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	proto.Reset(m)
	c.bad.Store(v, undecodable(data.Materialize(), m.ProtoReflect().Descriptor(), err))
	return nil
}

// take returns (and forgets) why req did not decode, or nil.
func (c *requestCodec) take(req any) error {
	if req == nil {
		return nil
	}
	if err, ok := c.bad.LoadAndDelete(req); ok {
		return err.(error)
	}
	return nil
}

// undecodable says why b is not a valid md: the first string field (by its path in the API's naming,
// such as spec.volume_target_path) that is not UTF-8, or else that it is not a message of that type.
func undecodable(b []byte, md protoreflect.MessageDescriptor, err error) error {
	if path := invalidUTF8(b, md, ""); path != "" {
		return errdefs.Field(path, "is not valid UTF-8")
	}
	return fmt.Errorf("the request is not a valid %s message: %v: %w", md.FullName(), err, errdefs.ErrInvalidArgument)
}

// invalidUTF8 returns the path of the first string field in b (a message md) that is not UTF-8, or "".
func invalidUTF8(b []byte, md protoreflect.MessageDescriptor, prefix string) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		field := b[:m]
		b = b[m:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			continue
		}
		inner, _ := protowire.ConsumeBytes(field)
		name := prefix + string(fd.Name())
		switch {
		case fd.IsMap():
			if p := invalidUTF8(inner, fd.Message(), name+"."); p != "" {
				return p
			}
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(inner):
			return name
		case fd.Kind() == protoreflect.MessageKind:
			if p := invalidUTF8(inner, fd.Message(), name+"."); p != "" {
				return p
			}
		}
	}
	return ""
}

// checkedStream answers a streamed request that did not decode as requestCodec.take says.
type checkedStream struct {
	grpc.ServerStream
	codec *requestCodec
}

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if bad := s.codec.take(m); bad != nil {
		return bad
	}
	return nil
}
