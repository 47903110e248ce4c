// Package wmsource turns any watermill (github.com/ThreeDotsLabs/watermill)
// message.Subscriber — Kafka, NATS, AMQP, SQL, GoChannel, runnel's own
// RocketMQ transport — into a runnel source.Source.
//
// # Delivery guarantee: at least once
//
// A message read from the subscriber is held un-acked. It is acked only
// after the checkpoint that covers it is durable (the runtime's
// NotifyCheckpointComplete): by then every record derived from it has been
// processed and flushed by the job's sinks. If the job fails, stops without
// completing a checkpoint, or its process dies, the held messages are never
// acked (Close nacks them; a killed process's connection drops them) and the
// subscriber's system delivers them again. A message whose checkpoint is
// durable but whose ack did not reach the broker before a crash is delivered
// again too: the guarantee is at least once, exactly once in effect only when
// the job's output is idempotent (for example sink.KV keyed by the message
// UUID).
//
// # Offsets
//
// watermill has no replayable offsets. SplitReader.Offset is an opaque
// sequence number (how many messages the split has returned, across restores),
// kept in checkpoints only so that the runtime has something to store and to
// detect corruption with. Restoring from a checkpoint does not seek: the
// split resumes with whatever the subscriber redelivers (the messages that
// were never acked), which is exactly the set the restored checkpoint does not
// cover, plus possibly a few it does (see above).
//
// # Throughput
//
// Most watermill subscribers (AMQP, Kafka, SQL, runnel's RocketMQ transport)
// hand over the next message of a subscription only after the previous one
// was acked or nacked. With acks deferred to checkpoints such a subscription
// delivers about one message per checkpoint. Raise WithSubscriptions (when the
// subscriber's subscriptions of a topic compete for messages, like consumers
// of one AMQP queue) and shorten the job's checkpoint interval; or consume
// the system natively (source/rocketmq reads RocketMQ by offset, without
// this limit). GoChannel delivers every message of a topic concurrently and
// is not limited this way.
//
// # Ownership
//
// A Source uses but does not own its Subscriber: close the Subscriber after
// the job's Run returns. Each split subscribes once, with a context that ends
// when the split's reader is closed.
package wmsource

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/runnel-dev/runnel/source"
)

var (
	// ErrSubscriptionClosed is returned by Poll when the subscriber closed a
	// split's message channel while the job was running (the subscriber was
	// closed under the job).
	ErrSubscriptionClosed = errors.New("wmsource: subscription channel closed")
	// ErrCloseTimeout is returned by Close when the subscriber did not close
	// the split's channel within the configured close timeout after the
	// subscription's context ended.
	ErrCloseTimeout = errors.New("wmsource: subscription did not end in time")
	// ErrDecode wraps errors of a NewDecoded source's decode function.
	ErrDecode = errors.New("wmsource: cannot decode message")
)

const (
	offsetVersion = 1
	offsetLen     = 9 // version byte + big-endian uint64 sequence

	// DefaultCloseTimeout is how long Close waits, by default, for the
	// subscriber to end a split's subscription.
	DefaultCloseTimeout = 30 * time.Second
)

// Option configures a Source.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	subscriptions int
	eventTime     func(*message.Message) time.Time
	closeTimeout  time.Duration
}

// WithSubscriptions sets the number of splits, each one Subscribe call on the
// topic (default 1). Use more than one only with subscribers whose
// subscriptions of one topic share its messages (competing consumers, like
// watermill-amqp's queue configurations): a fan-out subscriber such as
// GoChannel delivers every message to every subscription, and each split
// would process each message.
func WithSubscriptions(n int) Option {
	return optionFunc(func(c *config) { c.subscriptions = max(n, 1) })
}

// WithEventTime sets each record's event time from its message (for example
// from a metadata field). Without it the runtime uses the time the record
// was polled.
func WithEventTime(fn func(*message.Message) time.Time) Option {
	return optionFunc(func(c *config) { c.eventTime = fn })
}

// WithCloseTimeout bounds how long a split's Close waits for the subscriber to
// end the subscription and close its channel (DefaultCloseTimeout).
func WithCloseTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.closeTimeout = d
		}
	})
}

// Source reads a watermill topic as a runnel source of T. It is safe for
// concurrent use by several split tasks; each split's reader belongs to one
// task.
type Source[T any] struct {
	sub    message.Subscriber
	topic  string
	decode func(*message.Message) (T, error)
	cfg    config
}

// New returns a source of the topic's messages. Records are copies of the
// subscriber's messages (same UUID, metadata, payload and context) so that
// nothing downstream can ack or nack the original: acking is the source's.
func New(sub message.Subscriber, topic string, opts ...Option) *Source[*message.Message] {
	return NewDecoded(sub, topic, copyMessage, opts...)
}

// NewDecoded returns a source of T decoded from the topic's messages by
// decode. decode must not Ack or Nack the message. A decode error fails the
// job (wrapped in ErrDecode); to route undecodable messages to a bad-record
// policy instead, use New with pipeline.FromSourceDecoded.
func NewDecoded[T any](sub message.Subscriber, topic string, decode func(*message.Message) (T, error), opts ...Option) *Source[T] {
	cfg := config{subscriptions: 1, closeTimeout: DefaultCloseTimeout}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return &Source[T]{sub: sub, topic: topic, decode: decode, cfg: cfg}
}

func copyMessage(m *message.Message) (*message.Message, error) {
	c := m.Copy()
	c.SetContext(m.Context())
	return c, nil
}

// Splits implements source.Source: one split per subscription, "0", "1", ….
func (s *Source[T]) Splits(context.Context) ([]source.Split, error) {
	splits := make([]source.Split, s.cfg.subscriptions)
	for i := range splits {
		splits[i] = source.Split{ID: strconv.Itoa(i)}
	}
	return splits, nil
}

// Open implements source.Source: it subscribes to the topic. restored, when
// not nil, must be an offset of this source; it only continues the split's
// sequence (see the package documentation).
func (s *Source[T]) Open(ctx context.Context, split source.Split, restored []byte) (source.SplitReader[T], error) {
	var seq uint64
	if restored != nil {
		var err error
		if seq, err = decodeOffset(restored); err != nil {
			return nil, err
		}
	}
	if s.sub == nil {
		return nil, errors.New("wmsource: nil subscriber")
	}
	if s.decode == nil {
		return nil, errors.New("wmsource: nil decode function")
	}
	// The subscription lives as long as the reader, not as long as Open's
	// ctx: it keeps ctx's values and is ended by Close.
	subCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := s.sub.Subscribe(subCtx, s.topic)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("wmsource: subscribe to %q (split %s): %w", s.topic, split.ID, err)
	}
	return &reader[T]{src: s, ch: ch, cancel: cancel, seq: seq}, nil
}

func decodeOffset(b []byte) (uint64, error) {
	if len(b) != offsetLen || b[0] != offsetVersion {
		return 0, fmt.Errorf("%w: wmsource offset of %d bytes (want %d, version %d)", source.ErrBadOffset, len(b), offsetLen, offsetVersion)
	}
	return binary.BigEndian.Uint64(b[1:]), nil
}

func appendOffset(dst []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, offsetVersion), seq)
}

// reader is one split's subscription. It is used by its split's task only.
type reader[T any] struct {
	src    *Source[T]
	ch     <-chan *message.Message
	cancel context.CancelFunc
	seq    uint64 // messages returned so far, across restores

	held []*message.Message // returned, not yet acked, in delivery order
	mark int                // held[:mark] are covered by the latest Offset call

	recs   []source.Record[T] // reused: valid until the next Poll
	offBuf []byte             // reused backing of the records' offsets
	closed bool
}

// Poll implements source.SplitReader: it waits for the first message (or
// ctx) and then takes whatever else is ready, up to max.
func (r *reader[T]) Poll(ctx context.Context, n int) ([]source.Record[T], error) {
	if r.closed {
		return nil, errors.New("wmsource: poll after close")
	}
	n = min(max(n, 1), 4096)
	var first *message.Message
	select {
	case m, ok := <-r.ch:
		if !ok {
			return nil, ErrSubscriptionClosed
		}
		first = m
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.recs = r.recs[:0]
	r.offBuf = r.offBuf[:0]
	if err := r.add(first); err != nil {
		return nil, err
	}
	for len(r.recs) < n {
		select {
		case m, ok := <-r.ch:
			if !ok {
				// Return what was read; the next Poll reports the end.
				return r.finish(), nil
			}
			if err := r.add(m); err != nil {
				return nil, err
			}
			continue
		default:
		}
		break
	}
	return r.finish(), nil
}

func (r *reader[T]) add(m *message.Message) error {
	if m == nil {
		return nil
	}
	r.held = append(r.held, m)
	v, err := r.src.decode(m)
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrDecode, m.UUID, err)
	}
	r.seq++
	rec := source.Record[T]{Value: v, Raw: m.Payload}
	if r.src.cfg.eventTime != nil {
		rec.EventTime = r.src.cfg.eventTime(m)
	}
	r.offBuf = appendOffset(r.offBuf, r.seq)
	r.recs = append(r.recs, rec)
	return nil
}

// finish points the records' offsets into offBuf (which may have moved
// while growing).
func (r *reader[T]) finish() []source.Record[T] {
	for i := range r.recs {
		r.recs[i].Offset = r.offBuf[i*offsetLen : (i+1)*offsetLen : (i+1)*offsetLen]
	}
	return r.recs
}

// Offset implements source.SplitReader. The runtime calls it when it
// snapshots the split for a checkpoint; the messages returned so far are
// the ones that checkpoint covers, acked when it completes.
func (r *reader[T]) Offset() []byte {
	r.mark = len(r.held)
	return appendOffset(make([]byte, 0, offsetLen), r.seq)
}

// NotifyCheckpointComplete implements source.SplitReader: it acks the
// messages covered by the completed checkpoint. The runtime runs one
// checkpoint at a time and delivers a checkpoint's completion before it
// snapshots the split for the next one, so the latest Offset call is the
// completed checkpoint's.
func (r *reader[T]) NotifyCheckpointComplete(context.Context, uint64) error {
	if r.mark == 0 {
		return nil
	}
	for i, m := range r.held[:r.mark] {
		m.Ack()
		r.held[i] = nil
	}
	r.held = append(r.held[:0], r.held[r.mark:]...)
	r.mark = 0
	return nil
}

// Close implements source.SplitReader: it nacks every message not covered by
// a completed checkpoint, ends the subscription and waits (up to the close
// timeout) for the subscriber to close its channel, nacking whatever it
// still hands over.
func (r *reader[T]) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	for i, m := range r.held {
		m.Nack()
		r.held[i] = nil
	}
	r.held, r.mark = r.held[:0], 0
	r.cancel()
	t := time.NewTimer(r.src.cfg.closeTimeout)
	defer t.Stop()
	for {
		select {
		case m, ok := <-r.ch:
			if !ok {
				return nil
			}
			if m != nil {
				m.Nack()
			}
		case <-t.C:
			return fmt.Errorf("%w: topic %q after %v", ErrCloseTimeout, r.src.topic, r.src.cfg.closeTimeout)
		}
	}
}
