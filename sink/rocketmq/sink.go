package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/sink"
	"github.com/runnel-dev/runnel/transport/client"
)

// DefaultMaxInFlight is the default bound on unanswered sends of a Sink.
const DefaultMaxInFlight = 1024

// closeWait bounds Close's wait for answers beyond the send timeout.
const closeWait = 5 * time.Second

var (
	// ErrClosed is returned by Write and Flush after Close.
	ErrClosed = errors.New("rocketmq sink: closed")
	// ErrInvalidOption is wrapped by New's errors for unusable options.
	ErrInvalidOption = errors.New("rocketmq sink: invalid option")
)

// Option configures a Sink.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	maxInFlight int
	sendTimeout time.Duration
}

// WithMaxInFlight bounds the sends waiting for the broker's answer (default
// DefaultMaxInFlight).
func WithMaxInFlight(n int) Option { return optionFunc(func(c *config) { c.maxInFlight = n }) }

// WithSendTimeout bounds the wait for each answer (default
// client.DefaultRequestTimeout).
func WithSendTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.sendTimeout = d })
}

// Sink is an at-least-once RocketMQ sink (see the package documentation).
// Write, Flush and Close are for the sink's task goroutine (the runtime's
// contract); answers arrive on the producer's goroutines.
type Sink[T any] struct {
	p      *client.Producer
	mapper func(T) (*client.Message, error)
	cfg    config
	sem    chan struct{} // one token per unanswered send
	closed bool

	mu struct {
		sync.Mutex
		failed  []*client.Message // sends that failed, to send again
		lastErr error             // why the last of them failed
	}
}

var _ sink.Sink[int] = (*Sink[int])(nil)

// New returns a Sink sending mapper(v) for each record v through p. mapper
// returns a new Message for each call (the sink keeps it until answered);
// its Topic is required.
func New[T any](p *client.Producer, mapper func(T) (*client.Message, error), opts ...Option) (*Sink[T], error) {
	cfg := config{maxInFlight: DefaultMaxInFlight, sendTimeout: client.DefaultRequestTimeout}
	for _, o := range opts {
		o.apply(&cfg)
	}
	switch {
	case p == nil:
		return nil, fmt.Errorf("%w: nil producer", ErrInvalidOption)
	case mapper == nil:
		return nil, fmt.Errorf("%w: nil mapper", ErrInvalidOption)
	case cfg.maxInFlight < 1 || cfg.maxInFlight > 1<<20:
		return nil, fmt.Errorf("%w: max in flight %d outside [1, 1<<20]", ErrInvalidOption, cfg.maxInFlight)
	case cfg.sendTimeout <= 0:
		return nil, fmt.Errorf("%w: send timeout %v <= 0", ErrInvalidOption, cfg.sendTimeout)
	}
	return &Sink[T]{p: p, mapper: mapper, cfg: cfg, sem: make(chan struct{}, cfg.maxInFlight)}, nil
}

// Write implements sink.Sink: it maps v and sends the message
// asynchronously. It blocks while WithMaxInFlight sends are unanswered, and
// first sends again (synchronously) any message whose send failed; it returns
// a mapping error or a resend error.
func (s *Sink[T]) Write(ctx context.Context, v T) error {
	if s.closed {
		return ErrClosed
	}
	m, err := s.mapper(v)
	if err != nil {
		return fmt.Errorf("rocketmq sink: map record: %w", err)
	}
	if m == nil {
		return errors.New("rocketmq sink: mapper returned a nil message")
	}
	if err := s.resend(ctx); err != nil {
		return err
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.sendTimeout)
	s.p.SendAsync(sctx, func(_ client.SendResult, err error) {
		cancel()
		if err != nil {
			s.mu.Lock()
			s.mu.failed = append(s.mu.failed, m)
			s.mu.lastErr = err
			s.mu.Unlock()
		}
		<-s.sem
	}, m)
	return nil
}

// Flush implements sink.Sink: it waits for every unanswered send, sends the
// failed ones again synchronously, and returns the first error that remains
// (nil when every record written so far is stored).
func (s *Sink[T]) Flush(ctx context.Context) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.drain(ctx); err != nil {
		return err
	}
	return s.resend(ctx)
}

// drain waits until no send is unanswered.
func (s *Sink[T]) drain(ctx context.Context) error { return drainSem(ctx, s.sem, "sends") }

// drainSem waits until every token of sem (one per send in flight) can be
// taken, i.e. no send is in flight, then gives them back. what names the
// sends in the error when ctx ends first.
func drainSem(ctx context.Context, sem chan struct{}, what string) error {
	n := 0
	defer func() {
		for range n {
			<-sem
		}
	}()
	for n < cap(sem) {
		select {
		case sem <- struct{}{}:
			n++
		case <-ctx.Done():
			return fmt.Errorf("rocketmq sink: waiting for %d %s: %w", cap(sem)-n, what, ctx.Err())
		}
	}
	return nil
}

// resend sends the failed messages again, synchronously, in order.
func (s *Sink[T]) resend(ctx context.Context) error {
	s.mu.Lock()
	failed := s.mu.failed
	s.mu.failed = nil
	s.mu.Unlock()
	for i, m := range failed {
		if _, err := s.p.Send(ctx, m); err != nil {
			s.mu.Lock()
			s.mu.failed = append(failed[i:len(failed):len(failed)], s.mu.failed...)
			s.mu.Unlock()
			return fmt.Errorf("rocketmq sink: send to %s: %w", m.Topic, err)
		}
	}
	return nil
}

// Pending returns the number of records written but not known to be stored
// (unanswered or failed sends). It is safe from any goroutine.
func (s *Sink[T]) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sem) + len(s.mu.failed)
}

// Close implements sink.Sink: it waits (up to the send timeout plus a few
// seconds) for unanswered sends so that no callback outlives the sink, and
// releases nothing else: the Producer stays open. It is idempotent.
func (s *Sink[T]) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.sendTimeout+closeWait)
	defer cancel()
	return s.drain(ctx)
}
