package errdefs

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kinds pairs each kind with its gRPC code, one code per kind. The context errors stand for themselves.
var kinds = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrAborted, codes.Aborted},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrUnavailable, codes.Unavailable},
	{ErrUnimplemented, codes.Unimplemented},
	{ErrOutOfRange, codes.OutOfRange},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrInternal, codes.Internal},
	{ErrUnknown, codes.Unknown},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
}

// ToGRPC returns err as a gRPC status error whose message is err's text: the code of err's kind, a
// status's own code for an error that came from FromGRPC or from gRPC (wrapped or not), and Internal for
// an error of no kind. A *FieldError (at any depth) adds a google.rpc.BadRequest detail naming its field,
// which FromGRPC turns back into a *FieldError; a *HeldError adds its google.rpc.ErrorInfo. Nil gives nil.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	var ge *grpcError
	if errors.As(err, &ge) {
		if err == error(ge) {
			return ge.st.Err()
		}
		p := ge.st.Proto()
		p.Message = err.Error()
		return status.FromProto(p).Err()
	}
	code, ok := codes.Internal, false
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			code, ok = k.code, true
			break
		}
	}
	if !ok {
		if s, isStatus := status.FromError(err); isStatus {
			return s.Err()
		}
	}
	st := status.New(code, err.Error())
	var fe *FieldError
	var he *HeldError
	switch {
	case errors.As(err, &fe):
		if d, derr := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: fe.Field, Description: fe.Reason},
		}}); derr == nil {
			st = d
		}
	case errors.As(err, &he):
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: HeldDomain, Reason: HeldReason,
			Metadata: map[string]string{"holder": he.Holder}}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// Status returns the gRPC status err carries, and whether it carries one: an error a call answered, or
// an error of Field, New or Errorf (their GRPCStatus), wrapped or not. It is for the edge of a process that
// reports errors as gRPC codes (crustctl's "CODE: message").
func Status(err error) (*status.Status, bool) {
	if err == nil {
		return nil, false
	}
	return status.FromError(err)
}

// KindOf returns the kind of err, as ToGRPC picks its code: the first of the sentinel kinds (and
// context.Canceled, context.DeadlineExceeded) that errors.Is finds in err, ErrUnknown for a status of no
// kind's code, ErrInternal for an error of no kind, nil for nil.
func KindOf(err error) error {
	if err == nil {
		return nil
	}
	code := status.Code(ToGRPC(err))
	for _, k := range kinds {
		if k.code == code {
			return k.err
		}
	}
	return ErrUnknown
}

// FromGRPC returns the error a gRPC call answered as an error of its code's kind (errors.Is holds for the
// kind), with the status's message as its text; a status with a BadRequest detail of one field gives an
// error for which errors.As finds a *FieldError. The result still carries the status, so that ToGRPC (or
// gRPC itself) passes it on with the same code and details. A FAILED_PRECONDITION with a HeldError's
// ErrorInfo gives an error for which errors.As finds a *HeldError. OK and nil give nil; an error that is not a
// status is returned as it is.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.OK {
		return nil
	}
	kind := ErrUnknown
	for _, k := range kinds {
		if k.code == st.Code() {
			kind = k.err
			break
		}
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			if st.Code() == codes.InvalidArgument && len(d.GetFieldViolations()) == 1 {
				v := d.GetFieldViolations()[0]
				kind = &FieldError{Field: v.GetField(), Reason: v.GetDescription()}
			}
		case *errdetails.ErrorInfo:
			if st.Code() == codes.FailedPrecondition && d.GetDomain() == HeldDomain && d.GetReason() == HeldReason {
				kind = &HeldError{Holder: d.GetMetadata()["holder"], Message: st.Message()}
			}
		}
	}
	return &grpcError{st: st, kind: kind}
}

// grpcError is a status read back into a kind.
type grpcError struct {
	st   *status.Status
	kind error
}

func (e *grpcError) Error() string              { return e.st.Message() }
func (e *grpcError) Unwrap() error              { return e.kind }
func (e *grpcError) GRPCStatus() *status.Status { return e.st }

// UnaryServerInterceptor answers a handler's error with ToGRPC: a server installs it, and its handlers
// return errors of errdefs' kinds.
func UnaryServerInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, ToGRPC(err)
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls.
func StreamServerInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return ToGRPC(h(srv, ss))
}

// UnaryClientInterceptor returns a call's error as FromGRPC reads it: an error of its code's kind that
// still carries the status.
func UnaryClientInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return FromGRPC(invoker(ctx, method, req, reply, cc, opts...))
}

// StreamClientInterceptor is UnaryClientInterceptor for streaming calls: the error of opening the stream
// and of every message received.
func StreamClientInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, FromGRPC(err)
	}
	return &clientStream{ClientStream: s}, nil
}

// clientStream reads every error of a stream with FromGRPC (io.EOF is not a status and passes as it is).
type clientStream struct{ grpc.ClientStream }

func (s *clientStream) RecvMsg(m any) error { return FromGRPC(s.ClientStream.RecvMsg(m)) }
func (s *clientStream) SendMsg(m any) error { return FromGRPC(s.ClientStream.SendMsg(m)) }
func (s *clientStream) CloseSend() error    { return FromGRPC(s.ClientStream.CloseSend()) }
