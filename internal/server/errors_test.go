package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/internal/errdefs"
)

func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{errdefs.Field("spec.fs_type", "%q is not allowed", "vfat"), codes.InvalidArgument, `spec.fs_type: "vfat" is not allowed`},
		{fmt.Errorf("volume %q: %w", "/t", errdefs.ErrNotFound), codes.NotFound, `volume "/t": not found`},
		{fmt.Errorf("x: %w", errdefs.ErrAlreadyExists), codes.AlreadyExists, "x: already exists"},
		{fmt.Errorf("x: %w", errdefs.ErrFailedPrecondition), codes.FailedPrecondition, "x: failed precondition"},
		{fmt.Errorf("x: %w", errdefs.ErrAborted), codes.Aborted, "x: operation already in flight"},
		{fmt.Errorf("x: %w", errdefs.ErrPermissionDenied), codes.PermissionDenied, "x: permission denied"},
		{fmt.Errorf("x: %w", errdefs.ErrUnavailable), codes.Unavailable, "x: unavailable"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "x: context deadline exceeded"},
		{status.Error(codes.ResourceExhausted, "handler says no"), codes.ResourceExhausted, "handler says no"},
		{errors.New("disk on fire"), codes.Internal, "disk on fire"},
		{errdefs.NoSpace(fmt.Errorf("store: %w", &os.PathError{Op: "write", Path: "/s/tmp/x", Err: syscall.ENOSPC})), codes.ResourceExhausted,
			"store: write /s/tmp/x: no space left on device: resource exhausted"},
		{errdefs.NoSpace(fmt.Errorf("store: %w", syscall.EDQUOT)), codes.ResourceExhausted, "store: disk quota exceeded: resource exhausted"},
		{errdefs.NoSpace(errors.New("other")), codes.Internal, "other"},
	} {
		s := status.Convert(toStatus(tc.err))
		if s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("%v: got %v %q, want %v %q", tc.err, s.Code(), s.Message(), tc.code, tc.msg)
		}
	}
	if toStatus(nil) != nil {
		t.Error("nil error became a status")
	}
}
