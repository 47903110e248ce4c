package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Sentinel errors. Broker replies are *protocol.Error values (match them with
// errors.Is(err, protocol.ErrTopicNotExist) and the like).
var (
	// ErrClosed is returned by calls made on (or interrupted by) a closed
	// Client or Producer.
	ErrClosed = errors.New("client: closed")
	// ErrInvalidOption is wrapped by the errors of New, NewProducer and
	// other constructors for a bad option.
	ErrInvalidOption = errors.New("client: invalid option")
	// ErrInvalidMessage is wrapped by the error of a send refused before
	// anything was sent (topic name, body size, properties, batch rules).
	ErrInvalidMessage = errors.New("client: invalid message")
	// ErrNoRoute is wrapped when a topic has no usable route: no writable
	// queue for a send, no readable queue or broker for a pull.
	ErrNoRoute = errors.New("client: no route")
	// ErrNoNameServer is wrapped when no name server answered.
	ErrNoNameServer = errors.New("client: no name server reachable")
	// ErrUnreachable is wrapped when no connection to a broker or name
	// server could be made; nothing was sent.
	ErrUnreachable = errors.New("client: address unreachable")
	// ErrNoOffset is returned by QueryConsumerOffset when the group has
	// no committed offset for the queue (QUERY_NOT_FOUND); it also matches
	// protocol.ErrQueryNotFound.
	ErrNoOffset = fmt.Errorf("client: no committed offset: %w", protocol.ErrQueryNotFound)
	// ErrTxUnsupported is wrapped when a broker refused a transactional
	// request because it does not implement it.
	ErrTxUnsupported = errors.New("client: transactions not supported by the broker")
)

// unreachableError: connecting failed, the request was never written.
type unreachableError struct {
	addr string
	err  error
}

func (e *unreachableError) Error() string {
	return "client: cannot connect to " + e.addr + ": " + e.err.Error()
}

func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

// sentError: the request was handed to a connection and then failed
// (timeout, connection lost, ctx ended): the peer may have applied it.
type sentError struct {
	addr string
	err  error
}

func (e *sentError) Error() string { return "client: request to " + e.addr + ": " + e.err.Error() }
func (e *sentError) Unwrap() error { return e.err }

// unsureError marks a send error after which the message may have been
// stored (an attempt timed out or lost its connection after writing).
type unsureError struct{ err error }

func (e *unsureError) Error() string { return e.err.Error() + " (the message may have been stored)" }
func (e *unsureError) Unwrap() error { return e.err }

// MaybeApplied reports whether err leaves the outcome of a request unknown:
// the request was sent (or may have been) and then timed out, lost its
// connection or was cancelled before its answer arrived, so the broker may
// have applied it. For a Send it means "sent, outcome unknown": a retry may
// store a duplicate, and exactly-once code must treat the message as possibly
// stored. It is false for errors raised before anything was sent (invalid
// message, no route, connection refused) and for broker replies, which say
// what happened.
func MaybeApplied(err error) bool {
	if err == nil {
		return false
	}
	var u *unsureError
	if errors.As(err, &u) {
		return true
	}
	var s *sentError
	return errors.As(err, &s)
}

// isTransport reports whether err is a transport failure (rather than a
// broker reply or a local refusal) worth trying elsewhere.
func isTransport(err error) bool {
	var s *sentError
	var u *unreachableError
	return errors.As(err, &s) || errors.As(err, &u)
}

// ctxDone reports whether err came from ctx having ended.
func ctxDone(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}
