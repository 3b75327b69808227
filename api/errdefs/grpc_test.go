package errdefs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crust.dev/crust/api/errdefs"
)

func TestToGRPC(t *testing.T) {
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
		{errdefs.Errorf(errdefs.ErrNotFound, "volume_path %s does not exist", "/v"), codes.NotFound, "volume_path /v does not exist"},
		{fmt.Errorf("x: %w", errdefs.ErrUnimplemented), codes.Unimplemented, "x: unimplemented"},
		{fmt.Errorf("x: %w", errdefs.ErrInternal), codes.Internal, "x: internal"},
		{fmt.Errorf("x: %w", errdefs.ErrUnknown), codes.Unknown, "x: unknown"},
		{fmt.Errorf("x: %w", context.Canceled), codes.Canceled, "x: context canceled"},
		{fmt.Errorf("handler: %w", errdefs.FromGRPC(status.Error(codes.OutOfRange, "too far"))), codes.OutOfRange, "handler: too far"},
		{errdefs.NoSpace(fmt.Errorf("store: %w", &os.PathError{Op: "write", Path: "/s/tmp/x", Err: syscall.ENOSPC})), codes.ResourceExhausted,
			"store: write /s/tmp/x: no space left on device: resource exhausted"},
		{errdefs.NoSpace(fmt.Errorf("store: %w", syscall.EDQUOT)), codes.ResourceExhausted, "store: disk quota exceeded: resource exhausted"},
		{errdefs.NoSpace(errors.New("other")), codes.Internal, "other"},
	} {
		s := status.Convert(errdefs.ToGRPC(tc.err))
		if s.Code() != tc.code || s.Message() != tc.msg {
			t.Errorf("%v: got %v %q, want %v %q", tc.err, s.Code(), s.Message(), tc.code, tc.msg)
		}
	}
	if errdefs.ToGRPC(nil) != nil {
		t.Error("nil error became a status")
	}
}

// Every kind crosses gRPC and back as itself, with the text it had, and a field error keeps its field.
func TestRoundTrip(t *testing.T) {
	for _, kind := range []error{
		errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
		errdefs.ErrAborted, errdefs.ErrPermissionDenied, errdefs.ErrUnavailable, errdefs.ErrUnimplemented,
		errdefs.ErrResourceExhausted, errdefs.ErrInternal, errdefs.ErrUnknown, context.DeadlineExceeded, context.Canceled,
	} {
		in := fmt.Errorf("volume %q: %w", "/t", kind)
		wire := errdefs.ToGRPC(in)
		out := errdefs.FromGRPC(wire)
		if !errors.Is(out, kind) || out.Error() != in.Error() {
			t.Errorf("%v: came back as %v (%q)", kind, out, out.Error())
		}
		for _, other := range []error{errdefs.ErrNotFound, errdefs.ErrInternal} {
			if other != kind && errors.Is(out, other) {
				t.Errorf("%v: came back as %v too", kind, other)
			}
		}
		if again := errdefs.ToGRPC(fmt.Errorf("relayed: %w", out)); status.Code(again) != status.Code(wire) ||
			status.Convert(again).Message() != "relayed: "+in.Error() {
			t.Errorf("%v: relayed as %v", kind, again)
		}
	}

	wire := errdefs.ToGRPC(fmt.Errorf("stage: %w", errdefs.Field("spec.fs_type", "%q is not allowed", "vfat")))
	out := errdefs.FromGRPC(wire)
	var fe *errdefs.FieldError
	if !errors.As(out, &fe) || fe.Field != "spec.fs_type" || fe.Reason != `"vfat" is not allowed` ||
		!errors.Is(out, errdefs.ErrInvalidArgument) || out.Error() != `stage: spec.fs_type: "vfat" is not allowed` {
		t.Errorf("field error came back as %#v (%v)", out, out)
	}
	held := &errdefs.HeldError{Holder: `sandbox "sb1" of pod shop/web-0`, Message: `device 7:0 is held by sandbox "sb1" of pod shop/web-0`}
	out = errdefs.FromGRPC(errdefs.ToGRPC(fmt.Errorf("relayed: %w", errdefs.FromGRPC(errdefs.ToGRPC(fmt.Errorf("stage: %w", held))))))
	var he *errdefs.HeldError
	if !errors.As(out, &he) || he.Holder != held.Holder || !errors.Is(out, errdefs.ErrFailedPrecondition) ||
		out.Error() != "relayed: stage: "+held.Message {
		t.Errorf("a held device's refusal came back, relayed, as %#v (%v)", out, out)
	}
	if errdefs.FromGRPC(nil) != nil || errdefs.FromGRPC(status.Error(codes.OK, "")) != nil {
		t.Error("no error became one")
	}
	plain := errors.New("not a status")
	if errdefs.FromGRPC(plain) != plain {
		t.Error("an error that is no status was changed")
	}
}

// An error of Field, New or Errorf keeps its code through gRPC's own reading (status.FromError), as a
// server that installs no interceptor answers it, wrapped or not.
func TestErrorsCarryTheirStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{errdefs.Field("spec.fs_type", "is required"), codes.InvalidArgument},
		{fmt.Errorf("publish: %w", errdefs.Field("device", "is required")), codes.InvalidArgument},
		{errdefs.Errorf(errdefs.ErrOutOfRange, "too big"), codes.OutOfRange},
		{fmt.Errorf("x: %w", errdefs.New(errdefs.ErrNotFound, "no such thing")), codes.NotFound},
	} {
		st, ok := status.FromError(tc.err)
		if !ok || st.Code() != tc.code || st.Message() != tc.err.Error() {
			t.Errorf("status.FromError(%v) = %v, %v; want %v with the error's text", tc.err, st, ok, tc.code)
		}
	}
}
