package watermill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/runnel-dev/runnel/transport/client"
)

// Defaults of PublisherConfig.
const (
	DefaultProducerGroup  = "watermill_publisher"
	DefaultPublishTimeout = 30 * time.Second
)

var (
	// ErrPublisherClosed is returned by Publish after Close.
	ErrPublisherClosed = errors.New("watermill: publisher closed")
	// ErrInvalidConfig is wrapped by the errors of NewPublisher and
	// NewSubscriber for a bad configuration.
	ErrInvalidConfig = errors.New("watermill: invalid config")
)

// PublisherConfig configures a Publisher. Exactly one of Client and
// NameServers must be set.
type PublisherConfig struct {
	// Client is the RocketMQ client to publish through. The Publisher does
	// not own it: Close leaves it open, and the caller closes it after the
	// Publisher.
	Client *client.Client
	// NameServers, when Client is nil, are the name server addresses
	// ("host:port") of a Client the Publisher creates (with ClientOptions),
	// owns and closes in Close.
	NameServers []string
	// ClientOptions are passed to client.New with NameServers.
	ClientOptions []client.Option

	// ProducerGroup is the RocketMQ producer group (DefaultProducerGroup).
	ProducerGroup string
	// ProducerOptions are passed to client.NewProducer (retries, send
	// timeout, compression, the queue count of auto-created topics, …).
	// With ShardingKey set, the selector is HashBySharding.
	ProducerOptions []client.ProducerOption

	// Marshaler turns watermill messages into RocketMQ messages
	// (DefaultMarshaler{} when nil).
	Marshaler Marshaler
	// ShardingKey, when set, gives each message an ordering key: messages
	// with equal keys go to the same queue (client.HashBySharding), so a
	// Subscriber receives them in publish order. Messages with an empty key
	// go round robin. See ShardingKeyFromMetadata.
	ShardingKey func(topic string, msg *message.Message) string
	// PublishTimeout bounds the send of one message, retries included
	// (DefaultPublishTimeout).
	PublishTimeout time.Duration
}

func (c *PublisherConfig) setDefaults() {
	if c.ProducerGroup == "" {
		c.ProducerGroup = DefaultProducerGroup
	}
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
}

// Validate checks the configuration (after defaults are applied).
func (c *PublisherConfig) Validate() error {
	switch {
	case c.Client == nil && len(c.NameServers) == 0:
		return fmt.Errorf("%w: Client or NameServers is required", ErrInvalidConfig)
	case c.Client != nil && len(c.NameServers) > 0:
		return fmt.Errorf("%w: Client and NameServers are exclusive", ErrInvalidConfig)
	case c.Client != nil && len(c.ClientOptions) > 0:
		return fmt.Errorf("%w: ClientOptions need NameServers", ErrInvalidConfig)
	case c.PublishTimeout < 0:
		return fmt.Errorf("%w: negative PublishTimeout", ErrInvalidConfig)
	}
	return nil
}

// Publisher is a watermill message.Publisher that sends to RocketMQ through
// runnel's client. It is safe for concurrent use.
type Publisher struct {
	cfg      PublisherConfig
	logger   watermill.LoggerAdapter
	c        *client.Client
	ownsC    bool
	producer *client.Producer

	inflight sync.WaitGroup // Publish calls in progress
	mu       struct {
		sync.Mutex
		closed   bool
		closeErr error
	}
	closeOnce sync.Once
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg and returns a Publisher. logger may be nil
// (watermill.NopLogger).
func NewPublisher(cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	p := &Publisher{cfg: cfg, logger: logger, c: cfg.Client}
	if p.c == nil {
		c, err := client.New(append([]client.Option{client.WithNameServers(cfg.NameServers...)}, cfg.ClientOptions...)...)
		if err != nil {
			return nil, fmt.Errorf("watermill: publisher client: %w", err)
		}
		p.c, p.ownsC = c, true
	}
	popts := cfg.ProducerOptions
	if cfg.ShardingKey != nil {
		popts = append(append([]client.ProducerOption(nil), popts...), client.WithSelector(client.HashBySharding()))
	}
	prod, err := client.NewProducer(p.c, cfg.ProducerGroup, popts...)
	if err != nil {
		if p.ownsC {
			_ = p.c.Close()
		}
		return nil, fmt.Errorf("watermill: publisher producer: %w", err)
	}
	p.producer = prod
	return p, nil
}

// Publish sends msgs to topic one after the other, in order, and returns once
// every message is stored by a broker (or at the first failure: messages
// before it are stored, the failed one maybe — client.MaybeApplied tells —
// and the later ones not). It blocks for the sends, each bounded by
// PublishTimeout; Close waits for Publish calls in progress.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return ErrPublisherClosed
	}
	p.inflight.Add(1)
	p.mu.Unlock()
	defer p.inflight.Done()

	for _, msg := range msgs {
		rm, err := p.cfg.Marshaler.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("watermill: marshal message %s: %w", msg.UUID, err)
		}
		if p.cfg.ShardingKey != nil && rm.ShardingKey == "" {
			rm.ShardingKey = p.cfg.ShardingKey(topic, msg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.PublishTimeout)
		_, err = p.producer.Send(ctx, rm)
		cancel()
		if err != nil {
			return fmt.Errorf("watermill: publish message %s to %s: %w", msg.UUID, topic, err)
		}
		p.logger.Trace("message published", watermill.LogFields{"message_uuid": msg.UUID, "topic": topic})
	}
	return nil
}

// Close refuses new Publish calls, waits for those in progress, closes the
// producer and, when the Publisher created it, the client. It is idempotent;
// later calls return the first call's result.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.mu.closed = true
		p.mu.Unlock()
		p.inflight.Wait()
		err := p.producer.Close()
		if p.ownsC {
			err = errors.Join(err, p.c.Close())
		}
		p.mu.Lock()
		p.mu.closeErr = err
		p.mu.Unlock()
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.closeErr
}
