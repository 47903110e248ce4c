// Package wmhandler runs watermill (github.com/ThreeDotsLabs/watermill)
// handlers and their middleware chains as runnel pipeline operators, so that
// code written for a watermill Router — a message.HandlerFunc wrapped in
// Recoverer, Retry, Timeout, CorrelationID, Throttle, PoisonQueue, … — moves
// into a checkpointed runnel job unchanged.
//
// # How a handler runs
//
// Handle (messages in, messages out) and Map (typed records converted to and
// from messages) call the handler once per record, on the record's task
// goroutine, with a copy of the input message (same UUID, metadata and
// payload; fresh ack state; its context is the task's, cancelled when the job
// fails, so Retry and handlers that honour it stop waiting then; a graceful
// stop waits for the record in hand). Every message the
// handler returns is emitted downstream, in order, as a Router would publish
// it. Acks belong to the job, not to the handler: acking or nacking the
// message passed to the handler (InstantAck, a handler's own msg.Ack) has no
// effect on the source, whose messages are acked after the checkpoint that
// covers them (see source/wmsource).
//
// # Errors
//
// A handler error (after the chain's own retries) is the operator's failure:
// the pipeline's OperatorOptions decide what follows — pipeline.Retry re-runs
// the whole chain, pipeline.OnError(pipeline.DeadLetter(…)) is runnel's poison
// queue (the record goes to a dead-letter sink with the error, checkpointed
// with the job), pipeline.OnError(pipeline.Skip()) drops it, and the default
// fails the job (a Router would nack and redeliver forever instead).
// watermill's own PoisonQueue middleware works too: it publishes the failed
// message with its publisher at once, outside checkpoints (so possibly twice
// after a crash), and reports success to the operator. Panics in the handler
// are recovered by the pipeline (pipeline.ErrPanic) or, inside the chain, by
// middleware.Recoverer.
//
// # Differences from a Router
//
// A Router runs handlers concurrently per subscription; here a handler runs
// on its record's task (one per source split, or per keyed subtask after
// KeyBy), serially. Router-only context values (message.HandlerNameFromCtx,
// SubscribeTopicFromCtx, …) are not set. Handlers and middleware must be safe
// for concurrent use when the operator runs in several tasks, as they must be
// under a Router.
package wmhandler

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/runnel-dev/runnel/pipeline"
)

// Wrap returns h wrapped in middlewares in watermill Router order: the first
// middleware is the outermost (it runs first and sees the final result), as
// with Router.AddMiddleware(middlewares...).
func Wrap(h message.HandlerFunc, middlewares ...message.HandlerMiddleware) message.HandlerFunc {
	for i := len(middlewares) - 1; i >= 0; i-- {
		if middlewares[i] != nil {
			h = middlewares[i](h)
		}
	}
	return h
}

// Handle runs h on every message of s and emits the messages it returns.
// Wrap middleware around h first (Wrap(h, middleware.Recoverer, …)). uid is
// the operator's UID; opts are the pipeline's operator options (Retry,
// OnError). The input message itself is never changed.
func Handle(s *pipeline.Stream[*message.Message], uid string, h message.HandlerFunc, opts ...pipeline.OperatorOption) *pipeline.Stream[*message.Message] {
	return apply(s, uid, identity, h, identity, true, opts)
}

func identity(m *message.Message) (*message.Message, error) { return m, nil }

// Map runs h on the message toMsg makes of every record of s and emits
// fromMsg of every message h returns (zero or more records per input, as a
// Router handler publishes zero or more messages). A toMsg, handler or
// fromMsg error is the operator's failure (see the package documentation).
// toMsg's message is passed to the handler as it is (Map copies only messages
// of Handle, which the upstream may still hold).
func Map[T, U any](s *pipeline.Stream[T], uid string, toMsg func(T) (*message.Message, error), h message.HandlerFunc, fromMsg func(*message.Message) (U, error), opts ...pipeline.OperatorOption) *pipeline.Stream[U] {
	return apply(s, uid, toMsg, h, fromMsg, false, opts)
}

func apply[T, U any](s *pipeline.Stream[T], uid string, toMsg func(T) (*message.Message, error), h message.HandlerFunc, fromMsg func(*message.Message) (U, error), copyIn bool, opts []pipeline.OperatorOption) *pipeline.Stream[U] {
	return pipeline.FlatMap(s, uid, func(ctx context.Context, v T, out *pipeline.Collector[U]) error {
		in, err := toMsg(v)
		if err != nil {
			return fmt.Errorf("wmhandler: to message: %w", err)
		}
		if in == nil {
			return errors.New("wmhandler: to message returned nil")
		}
		if copyIn {
			in = in.Copy()
		}
		in.SetContext(ctx)
		produced, err := h(in)
		if err != nil {
			return err
		}
		for _, m := range produced {
			if m == nil {
				continue
			}
			u, err := fromMsg(m)
			if err != nil {
				return fmt.Errorf("wmhandler: from message %s: %w", m.UUID, err)
			}
			out.Emit(u)
		}
		return out.Err()
	}, opts...)
}
