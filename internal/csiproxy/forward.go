package csiproxy

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	gproto "google.golang.org/protobuf/proto"

	"crust.dev/crust/api/errdefs"
)

// frame is one gRPC message forwarded without decoding.
type frame struct{ data []byte }

// rawCodec passes frames through as bytes and every other value to the proto codec, so that one server
// serves typed CSI methods and raw-forwarded unknown ones. It names itself "proto": the bytes on the wire
// are protobuf either way.
type rawCodec struct{ proto encoding.CodecV2 }

func newRawCodec() rawCodec { return rawCodec{proto: encoding.GetCodecV2(proto.Name)} }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(f.data)}, nil
	}
	return c.proto.Marshal(v)
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		f.data = data.Materialize()
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

func (rawCodec) Name() string { return proto.Name }

// outgoing returns a context carrying ctx's incoming metadata as outgoing metadata, without the
// transport's own keys.
func outgoing(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || len(md) == 0 {
		return ctx
	}
	out := metadata.MD{}
	for k, v := range md {
		if strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") ||
			k == "content-type" || k == "user-agent" || k == "te" {
			continue
		}
		out[k] = v
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// forwardUnknown forwards a call of a method this proxy does not serve itself (any service, any
// streaming shape) to the driver as raw frames, with its metadata, headers and trailers.
func (p *Proxy) forwardUnknown(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return errdefs.New(errdefs.ErrInternal, "no method in the stream")
	}
	ctx, cancel := context.WithCancel(outgoing(ss.Context()))
	defer cancel()
	cs, err := p.driver.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method,
		grpc.ForceCodecV2(p.codec))
	if err != nil {
		return err
	}
	// Client to driver.
	upErr := make(chan error, 1)
	go func() {
		for {
			f := &frame{}
			if err := ss.RecvMsg(f); err != nil {
				if errors.Is(err, io.EOF) {
					upErr <- cs.CloseSend()
					return
				}
				upErr <- err
				return
			}
			if err := cs.SendMsg(f); err != nil {
				upErr <- err
				return
			}
		}
	}()
	// Driver to client.
	if md, err := cs.Header(); err == nil {
		if err := ss.SendHeader(md); err != nil {
			return err
		}
	}
	for {
		f := &frame{}
		err := cs.RecvMsg(f)
		if errors.Is(err, io.EOF) {
			ss.SetTrailer(cs.Trailer())
			return nil
		}
		if err != nil {
			ss.SetTrailer(cs.Trailer())
			return err // the driver's status, as it came
		}
		if err := ss.SendMsg(f); err != nil {
			return err
		}
		select {
		case err := <-upErr:
			if err != nil {
				return errdefs.Errorf(errdefs.ErrInternal, "forwarding to the driver: %v", err)
			}
			upErr = nil // closed for sending; keep receiving
		default:
		}
	}
}

// rawRequestKey carries, in a call's context, the request's bytes as they came (a *frame), so that a call
// passed through to the driver unchanged is forwarded as exactly those bytes.
type rawRequestKey struct{}

// keepRaw wraps a unary method handler: the request is read as bytes first, put in the context (see
// rawRequestKey), and decoded from them for the typed method.
func keepRaw(h grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		f := &frame{}
		if err := dec(f); err != nil {
			return nil, err
		}
		ctx = context.WithValue(ctx, rawRequestKey{}, f)
		return h(srv, ctx, func(v any) error {
			if err := gproto.Unmarshal(f.data, v.(gproto.Message)); err != nil {
				// before the interceptors: the error carries its status itself (errdefs.Errorf)
				return errdefs.Errorf(errdefs.ErrInternal, "grpc: error unmarshalling request: %v", err)
			}
			return nil
		}, ic)
	}
}

// nodeServiceDesc is csi.v1.Node with the requests of NodeStageVolume and NodePublishVolume kept as they
// came (keepRaw), for forwardAsIs.
func nodeServiceDesc() *grpc.ServiceDesc {
	d := csi.Node_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i, m := range d.Methods {
		if m.MethodName == "NodeStageVolume" || m.MethodName == "NodePublishVolume" {
			d.Methods[i].Handler = keepRaw(m.Handler)
		}
	}
	return &d
}

// forwardAsIs calls method of the driver with the request as it came, byte for byte, when the context
// carries it (see keepRaw), else with req, and decodes the driver's answer into resp. req must be the
// call's request as decoded, unchanged: a changed request is sent with the typed client instead.
func (p *Proxy) forwardAsIs(ctx context.Context, method string, req, resp any) error {
	if f, ok := ctx.Value(rawRequestKey{}).(*frame); ok {
		req = f
	}
	return p.driver.Invoke(outgoing(ctx), method, req, resp, grpc.ForceCodecV2(p.codec))
}
