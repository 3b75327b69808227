package agentproto

import (
	"errors"
	"fmt"

	"github.com/containerd/ttrpc"

	"crust.dev/crust/api/errdefs"
)

// Errors cross the agent's and the control socket's wires as gRPC status (ttrpc carries it). Both sides
// speak errdefs kinds, converted by crust's one pair of functions, errdefs.ToGRPC where an error leaves a
// server and errdefs.FromGRPC where it arrives; NewServer and Dial install them, so that no other code
// converts. Deadlines and cancellation are context's own errors on both sides; an error of no kind is
// INTERNAL.

// Errorf returns an error of kind (an errdefs kind, or context.DeadlineExceeded) whose message is
// formatted like fmt.Sprintf, without the kind's own words.
func Errorf(kind error, format string, args ...any) error {
	return errdefs.New(kind, fmt.Sprintf(format, args...))
}

// ToGRPC is errdefs.ToGRPC: err as a status error for the wire.
func ToGRPC(err error) error { return errdefs.ToGRPC(err) }

// FromGRPC is errdefs.FromGRPC, plus what only ttrpc says: a closed connection is errdefs.ErrUnavailable.
func FromGRPC(err error) error {
	if errors.Is(err, ttrpc.ErrClosed) {
		return Errorf(errdefs.ErrUnavailable, "the agent's connection: %v", err)
	}
	return errdefs.FromGRPC(err)
}
