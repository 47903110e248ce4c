package remoting

import (
	"context"
	"errors"
)

var (
	// ErrConnClosed is wrapped by every error a call returns because its
	// connection closed: calls pending at Close or at a read or write failure,
	// and calls made afterwards. The returned error also wraps the cause (the
	// read or write error, ErrWriteQueueFull, …) when there is one.
	//
	// A request that failed with ErrConnClosed may or may not have reached the
	// peer and been applied there.
	ErrConnClosed = errors.New("remoting: connection closed")

	// ErrTimeout is wrapped by the error of a call whose context deadline
	// passed before its response arrived. It itself wraps
	// context.DeadlineExceeded, so errors.Is matches either. The pending entry
	// is removed; a response arriving later is dropped and counted in
	// Stats.DroppedResponses. The request may have been applied by the peer.
	ErrTimeout error = timeoutError{}

	// ErrWriteQueueFull is the cause a connection is closed with when a
	// response or a server-initiated request could not be queued because the
	// connection's bounded write queue was full: the peer reads more slowly
	// than it makes us write. Closing is preferred over unbounded buffering.
	ErrWriteQueueFull = errors.New("remoting: write queue full (peer reads too slowly)")

	// ErrWriteQueueBytes is the cause a connection is closed with when a
	// response would take the bytes queued for its socket over
	// WithMaxQueuedBytes: the peer does not read what it asks for.
	ErrWriteQueueBytes = errors.New("remoting: queued output over its byte bound (peer reads too slowly)")

	// ErrFirstFrameTimeout is the cause a Server closes a connection with
	// when no complete frame arrived within WithFirstFrameTimeout of accept.
	ErrFirstFrameTimeout = errors.New("remoting: no complete first frame in time")

	// ErrServerClosed is returned by Server.Serve after Shutdown or Close, and
	// by Listen and Serve called after them.
	ErrServerClosed = errors.New("remoting: server closed")

	// ErrAlreadyResponded is returned by RequestCtx.Respond when the request
	// was already answered (each request gets at most one response).
	ErrAlreadyResponded = errors.New("remoting: request already answered")
)

// timeoutError is the type of ErrTimeout: a sentinel that unwraps to
// context.DeadlineExceeded.
type timeoutError struct{}

func (timeoutError) Error() string   { return "remoting: request timed out" }
func (timeoutError) Unwrap() error   { return context.DeadlineExceeded }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// closedError is the error a closed Conn hands to its pending and later
// calls: ErrConnClosed plus the cause.
type closedError struct{ cause error }

func (e *closedError) Error() string {
	if e.cause == nil {
		return ErrConnClosed.Error()
	}
	return ErrConnClosed.Error() + ": " + e.cause.Error()
}

func (e *closedError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrConnClosed}
	}
	return []error{ErrConnClosed, e.cause}
}

// errLocalClose is the cause of a Close called by the owner.
var errLocalClose = errors.New("remoting: closed locally")
