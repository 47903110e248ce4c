package rocketmq

import (
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// routeError turns a failed route lookup of topic into an error a person
// can act on; errors.Is still finds the cause (protocol.ErrTopicNotExist,
// client.ErrNoNameServer …). Unreachable name servers also match
// source.ErrUnavailable, so that a starting job waits for them.
func routeError(topic string, err error) error {
	switch {
	case errors.Is(err, protocol.ErrTopicNotExist):
		return &sourceError{
			msg:   fmt.Sprintf("rocketmq source: topic %q does not exist: the name servers know no route for it (create it first, e.g. `runnel topic create %s --queues 8`, or check the topic name and --namesrv)", topic, topic),
			cause: err,
		}
	case errors.Is(err, client.ErrNoNameServer), errors.Is(err, client.ErrUnreachable):
		return &sourceError{
			msg:   fmt.Sprintf("rocketmq source: route of %s: no name server reachable (is the name server, e.g. `runnel broker`, running at the address the client was given?): %v", topic, err),
			cause: err, unavailable: true,
		}
	}
	return fmt.Errorf("rocketmq source: route of %s: %w", topic, err)
}

// sourceError is an error with a message of its own over its cause.
type sourceError struct {
	msg         string
	cause       error
	unavailable bool // matches source.ErrUnavailable
}

func (e *sourceError) Error() string { return e.msg }

func (e *sourceError) Unwrap() []error {
	if e.unavailable {
		return []error{e.cause, source.ErrUnavailable}
	}
	return []error{e.cause}
}
