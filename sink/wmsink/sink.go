// Package wmsink turns any watermill (github.com/ThreeDotsLabs/watermill)
// message.Publisher into a runnel sink.Sink.
//
// # Delivery guarantee: at least once
//
// Write buffers messages and publishes them in batches (when a batch is full,
// and at Flush). Flush, which the runtime calls at every checkpoint barrier,
// returns only after every message written before it was published, that is
// after the publisher's Publish returned nil for it; a Publish error fails
// Flush and with it the checkpoint, and the unpublished messages stay
// buffered for the next Flush. After a crash the job replays from its latest
// checkpoint and writes the records since then again, so a message may be
// published more than once (with the same UUID when the job is
// deterministic): consumers that need exactly once deduplicate by UUID (for
// example watermill's Deduplicator middleware). How durable a published
// message is depends on the publisher (AMQP publisher confirms, Kafka acks,
// …).
//
// Publish takes no context: Flush and Write set each message's context to
// theirs before publishing, which publishers that watch the message context
// honour; a publisher that blocks regardless blocks Flush.
//
// # Ownership
//
// A Sink uses but does not own its Publisher unless WithClosePublisher is set.
// The runtime calls every method from one goroutine.
package wmsink

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

var (
	// ErrClosed is returned by Write and Flush after Close.
	ErrClosed = errors.New("wmsink: closed")
	// ErrEmptyTopic is returned when a message's topic is empty.
	ErrEmptyTopic = errors.New("wmsink: empty topic")
)

// DefaultBatchSize is the number of buffered messages that makes Write
// publish before Flush.
const DefaultBatchSize = 256

// Option configures a Sink.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	batch    int
	topicOf  func(*message.Message) string
	closePub bool
}

// WithBatchSize sets how many messages Write buffers before publishing them
// (DefaultBatchSize; 1 publishes in every Write).
func WithBatchSize(n int) Option { return optionFunc(func(c *config) { c.batch = max(n, 1) }) }

// WithTopicFunc picks each message's topic (the sink's topic when it returns "").
func WithTopicFunc(fn func(*message.Message) string) Option {
	return optionFunc(func(c *config) { c.topicOf = fn })
}

// WithClosePublisher makes Close close the publisher (the sink owns it).
func WithClosePublisher() Option { return optionFunc(func(c *config) { c.closePub = true }) }

// Sink publishes records as watermill messages.
type Sink[T any] struct {
	pub     message.Publisher
	topic   string
	marshal func(T) (*message.Message, error)
	cfg     config

	buf    []*message.Message
	topics []string // topic of each buffered message
	closed bool
	pubErr error // first error of a publisher Close
}

// New returns a sink publishing messages to topic.
func New(pub message.Publisher, topic string, opts ...Option) *Sink[*message.Message] {
	return NewEncoded(pub, topic, func(m *message.Message) (*message.Message, error) { return m, nil }, opts...)
}

// NewEncoded returns a sink publishing the message marshal makes of each
// record. For deduplication downstream, marshal should give a record's
// message a UUID that is the same when the record is replayed (derived from
// the record, not watermill.NewUUID).
func NewEncoded[T any](pub message.Publisher, topic string, marshal func(T) (*message.Message, error), opts ...Option) *Sink[T] {
	cfg := config{batch: DefaultBatchSize}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return &Sink[T]{pub: pub, topic: topic, marshal: marshal, cfg: cfg}
}

// Write implements sink.Sink: it buffers the record's message and publishes
// the buffer when it is full.
func (s *Sink[T]) Write(ctx context.Context, v T) error {
	if s.closed {
		return ErrClosed
	}
	m, err := s.marshal(v)
	if err != nil {
		return fmt.Errorf("wmsink: marshal: %w", err)
	}
	if m == nil {
		return errors.New("wmsink: marshal returned a nil message")
	}
	topic := s.topic
	if s.cfg.topicOf != nil {
		if t := s.cfg.topicOf(m); t != "" {
			topic = t
		}
	}
	if topic == "" {
		return ErrEmptyTopic
	}
	s.buf = append(s.buf, m)
	s.topics = append(s.topics, topic)
	if len(s.buf) >= s.cfg.batch {
		return s.publish(ctx)
	}
	return nil
}

// Flush implements sink.Sink: it returns once every buffered message is
// published.
func (s *Sink[T]) Flush(ctx context.Context) error {
	if s.closed {
		return ErrClosed
	}
	return s.publish(ctx)
}

// publish sends the buffer, one Publish call per run of messages with the
// same topic. On error the unpublished messages stay buffered.
func (s *Sink[T]) publish(ctx context.Context) error {
	if s.pub == nil {
		return errors.New("wmsink: nil publisher")
	}
	done := 0
	defer func() {
		if done == 0 {
			return
		}
		n := copy(s.buf, s.buf[done:])
		clear(s.buf[n:])
		s.buf = s.buf[:n]
		s.topics = s.topics[:copy(s.topics, s.topics[done:])]
	}()
	for done < len(s.buf) {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := done + 1
		for end < len(s.buf) && s.topics[end] == s.topics[done] {
			end++
		}
		batch := s.buf[done:end]
		for _, m := range batch {
			m.SetContext(ctx)
		}
		if err := s.pub.Publish(s.topics[done], batch...); err != nil {
			return fmt.Errorf("wmsink: publish %d messages to %q: %w", len(batch), s.topics[done], err)
		}
		done = end
	}
	return nil
}

// Buffered returns the number of messages written and not yet published.
func (s *Sink[T]) Buffered() int { return len(s.buf) }

// Close implements sink.Sink. Unpublished messages are dropped (as a crash
// would drop them; the job replays them from its checkpoint). It closes the
// publisher when WithClosePublisher was given. It is idempotent.
func (s *Sink[T]) Close() error {
	if s.closed {
		return s.pubErr
	}
	s.closed = true
	clear(s.buf)
	s.buf, s.topics = nil, nil
	if s.cfg.closePub && s.pub != nil {
		s.pubErr = s.pub.Close()
	}
	return s.pubErr
}
