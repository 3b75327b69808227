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
// Each kind has its own gRPC code. The conversion happens once at each boundary, in interceptors: a
// server installs UnaryServerInterceptor and StreamServerInterceptor (ToGRPC on what its handlers
// return), and a client's connection UnaryClientInterceptor and StreamClientInterceptor (FromGRPC on what
// it is answered; unixsocket.Dial and crustd.Dial install them). Nothing else builds or reads status
// codes. A *FieldError crosses with its field (in a google.rpc.BadRequest detail), so the other side gets
// a *FieldError back. An error made by Field, New or Errorf also carries its status itself (GRPCStatus),
// for a server that installs no interceptor: a CSI driver returning api/client's errors as they are.
package errdefs

import (
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/grpc/status"
)

// Sentinel kinds. Test with errors.Is. Each stands for one thing a caller can act on, whatever the call;
// the error's text says which volume, path or field. A failure that means something else gets a kind of
// its own rather than a near one.
var (
	// ErrInvalidArgument: the request itself is wrong (a missing or malformed field, a value the API
	// does not allow); the same request never succeeds, and nothing was changed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: what the request names does not exist: no volume staged at that target path, no volume
	// of that id, no such volume in the sandbox that was asked.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: what the request would create exists with other parameters (a target path staged
	// with another spec); the same request with the same parameters succeeds.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition: the request is well formed but the state of what it names does not allow it
	// now (the device changed or is mounted on the host, another sandbox holds the volume, the volume is
	// not mounted in the sandbox yet); it may succeed once that state changes.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrAborted: another call on the same target path is in flight; retry.
	ErrAborted = errors.New("operation already in flight")
	// ErrPermissionDenied: the caller is not allowed to make the call (its uid or gid is not admitted).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnavailable: a process the call needs cannot be reached now (crustd, the runtime handler that
	// holds the volume, a Kata shim, the CSI driver behind the proxy); retry.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnimplemented: the process that answers does not do that call, or not for that kind of volume.
	ErrUnimplemented = errors.New("unimplemented")
	// ErrOutOfRange: a value the request asks for lies outside the range that can be served: a size
	// that cannot be met as asked (a capacity its range forbids, a volume that would have to shrink), or
	// a watch revision crustd cannot resume after (it no longer keeps the changes since, or never issued
	// it: list again).
	ErrOutOfRange = errors.New("out of range")
	// ErrInternal: a fault of the component that answers, not of the request (a bug, a broken disk).
	ErrInternal = errors.New("internal")
	// ErrUnknown: a failure of no known kind, such as a status code no kind stands for.
	ErrUnknown = errors.New("unknown")
	// ErrResourceExhausted: storage is full: the disk that holds crust's state (ENOSPC, EDQUOT), or the
	// volume group a driver creates volumes in; nothing was changed, and the same call succeeds once
	// space returns.
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

// GRPCStatus is the error as ToGRPC gives it, so that gRPC answers it with its code and field where no
// interceptor converts it (a CSI driver returning api/client's errors as they are).
func (e *FieldError) GRPCStatus() *status.Status { return status.Convert(ToGRPC(e)) }

// Is makes errors.Is(err, ErrInvalidArgument) true for a *FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidArgument }

// Field returns a *FieldError for field, with a reason formatted like fmt.Sprintf.
func Field(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// HeldError is a refusal because another holder uses the device (one writer per device: a sandbox, or
// the node). It is an ErrFailedPrecondition; across gRPC it travels as a google.rpc.ErrorInfo detail
// (domain HeldDomain, reason HeldReason, metadata "holder"), which FromGRPC reads back into a *HeldError,
// so that a caller can tell the refused pod who holds its volume without parsing a message.
type HeldError struct {
	// Holder names the holder for people, such as `sandbox "abc" of pod shop/web-0 (...)` or `the node,
	// which mounts it for pod shop/cron-1 (...)`.
	Holder string
	// Message is the whole refusal: what was refused, the holder and the remedy.
	Message string
}

// The ErrorInfo of a *HeldError across gRPC.
const (
	HeldDomain = "crust.dev"
	HeldReason = "DEVICE_HELD"
)

// Error implements error.
func (e *HeldError) Error() string { return e.Message }

// GRPCStatus is the error as ToGRPC gives it (see FieldError.GRPCStatus).
func (e *HeldError) GRPCStatus() *status.Status { return status.Convert(ToGRPC(e)) }

// Is makes errors.Is(err, ErrFailedPrecondition) true for a *HeldError.
func (e *HeldError) Is(target error) bool { return target == ErrFailedPrecondition }

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

// GRPCStatus is the error as ToGRPC gives it (see FieldError.GRPCStatus).
func (e *kindError) GRPCStatus() *status.Status { return status.Convert(ToGRPC(e)) }
