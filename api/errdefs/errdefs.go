// Package errdefs is crust's one error vocabulary: the kinds of failure every crust component (crustd,
// the CSI proxy, api/client, runtime handlers) returns and tests for, and the one pair of functions that
// carries them across gRPC.
//
// Code that is not a gRPC server or client wraps a kind with context, for example
//
//	fmt.Errorf("volume %q: %w", target, errdefs.ErrNotFound)
//
// or returns a *FieldError for bad input, so that the message names the field and the reason. Callers test
// with errors.Is (and errors.As for a *FieldError).
//
// Each kind has its own gRPC code. A server turns an error into a status with ToGRPC where it answers, and
// a client turns a status back into a kind with FromGRPC where it is answered; nothing else builds or reads
// status codes. A *FieldError crosses with its field (in a google.rpc.BadRequest detail), so the other
// side gets a *FieldError back.
package errdefs

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel kinds. Test with errors.Is.
var (
	// ErrInvalidArgument: the request is malformed; nothing was changed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: no volume is staged at that target path.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the target path is staged with other parameters.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition: the volume's state does not allow the operation.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrAborted: another operation on the same target path is in flight.
	ErrAborted = errors.New("operation already in flight")
	// ErrPermissionDenied: the caller is not allowed.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnavailable: the owner of the volume (a runtime handler) cannot be reached.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnimplemented: the owner does not support the operation.
	ErrUnimplemented = errors.New("unimplemented")
	// ErrInternal: a fault of the component that answers, not of the request (a bug, a broken disk).
	ErrInternal = errors.New("internal")
	// ErrUnknown: a failure of no known kind, such as a status code no kind stands for.
	ErrUnknown = errors.New("unknown")
	// ErrResourceExhausted: the storage that holds crust's state is full (ENOSPC) or over quota (EDQUOT);
	// nothing was changed, and the same call succeeds once space returns.
	ErrResourceExhausted = errors.New("resource exhausted")
)

// NoSpace returns err marked ErrResourceExhausted when it is, at any depth, ENOSPC or EDQUOT; any other
// error (and nil) as it is.
func NoSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", err, ErrResourceExhausted)
	}
	return err
}

// FieldError is bad input in one field of a request. It is an ErrInvalidArgument.
type FieldError struct {
	// Field is the request field, in the API's snake_case naming, such as "spec.fs_type".
	Field string
	// Reason says what is wrong with it, such as `"vfat" is not one of ext3, ext4, xfs, btrfs`.
	Reason string
}

// Error implements error.
func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalidArgument) true for a *FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidArgument }

// Field returns a *FieldError for field, with a reason formatted like fmt.Sprintf.
func Field(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// New returns a sentinel error with its own text that is of kind: errors.Is holds for it and for kind,
// and ToGRPC gives it kind's code. A package that names its own failures defines them with New, so that
// callers and servers know their kind without a table of their own.
func New(kind error, text string) error { return &kindError{text: text, kind: kind} }

// Errorf returns an error of kind whose text is formatted like fmt.Sprintf: errors.Is holds for kind,
// and ToGRPC gives it kind's code. It is for a failure described once, where it happens; the text does
// not wrap the arguments, so an error among them counts for its words only.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{text: fmt.Sprintf(format, args...), kind: kind}
}

type kindError struct {
	text string
	kind error
}

func (e *kindError) Error() string { return e.text }
func (e *kindError) Unwrap() error { return e.kind }
