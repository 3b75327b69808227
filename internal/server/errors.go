package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/internal/errdefs"
)

// kinds maps the domain's error kinds to gRPC codes; this is the one place where that happens.
var kinds = []struct {
	err  error
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

// toStatus turns a domain error into a gRPC status error. An error of no known kind is Internal; an error
// that already is a status (from a forwarded call) keeps its code.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return status.Error(k.code, err.Error())
		}
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.Error(codes.Internal, err.Error())
}
