package agentproto

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/internal/errdefs"
)

// Errors cross the agent's and the control socket's wires as gRPC status (ttrpc carries it). Both sides
// speak errdefs kinds: ToGRPC turns one into a status where an error leaves a server, FromGRPC turns a
// status back into a kind where it arrives, and NewServer and Dial install them, so that no other code
// converts. Deadlines and cancellation are context's own errors on both sides; an error of no kind is
// INTERNAL.

// kinds pairs each errdefs kind with its code.
var kinds = []struct {
	kind error
	code codes.Code
}{
	{errdefs.ErrInvalidArgument, codes.InvalidArgument},
	{errdefs.ErrNotFound, codes.NotFound},
	{errdefs.ErrAlreadyExists, codes.AlreadyExists},
	{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
	{errdefs.ErrAborted, codes.Aborted},
	{errdefs.ErrPermissionDenied, codes.PermissionDenied},
	{errdefs.ErrUnavailable, codes.Unavailable},
	{errdefs.ErrUnimplemented, codes.Unimplemented},
	{errdefs.ErrResourceExhausted, codes.ResourceExhausted},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
}

// kindError is an error of one kind with its own message (not the kind's).
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Errorf returns an error of kind (an errdefs kind, or context.DeadlineExceeded) whose message is
// formatted like fmt.Sprintf, without the kind's own words.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// ToGRPC returns err as a gRPC status error: the code of its kind (INTERNAL for none) and its message. A
// status error is returned as it is; nil stays nil.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			return status.Error(k.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// FromGRPC returns a status error as an error of the kind of its code, with the status's message; a code
// of no kind (INTERNAL, UNKNOWN, ...) gives an error of no kind. A closed ttrpc connection is
// errdefs.ErrUnavailable. Any other error is returned as it is; nil stays nil.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ttrpc.ErrClosed) {
		return Errorf(errdefs.ErrUnavailable, "the agent's connection: %v", err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, k := range kinds {
		if st.Code() == k.code {
			return &kindError{kind: k.kind, msg: st.Message()}
		}
	}
	return errors.New(st.Message())
}
