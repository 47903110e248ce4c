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
	"github.com/runnel-dev/runnel/transport/protocol"
)

// InitialOffset says where a consumer group without a committed offset
// starts reading a queue.
type InitialOffset int

const (
	// OffsetFirst starts at the oldest message still stored (the default):
	// a new group sees messages published before it subscribed.
	OffsetFirst InitialOffset = iota
	// OffsetLast starts at the end: only messages stored after the group
	// first read the queue. The start offset is committed when the queue is
	// revoked, so later members do not skip what was stored in between.
	OffsetLast
)

// Defaults of SubscriberConfig.
const (
	DefaultPullBatchSize      = 32
	DefaultPollTimeout        = 10 * time.Second
	DefaultCommitInterval     = time.Second
	DefaultNackResendDelay    = 10 * time.Millisecond
	DefaultNackResendMaxDelay = 100 * time.Millisecond
	DefaultSendBackDelayLevel = 3
	DefaultTopicQueueNums     = 4
	DefaultTopicCluster       = "DefaultCluster"
	DefaultInitializeTimeout  = 30 * time.Second
	DefaultOperationTimeout   = 5 * time.Second
)

var (
	// ErrSubscriberClosed is returned by Subscribe and SubscribeInitialize
	// after Close.
	ErrSubscriberClosed = errors.New("watermill: subscriber closed")
	// ErrGroupActive is returned by Subscribe when the Subscriber already
	// has an active subscription in the same consumer group (see Subscribe).
	ErrGroupActive = errors.New("watermill: consumer group already subscribed by this subscriber")
)

// DefaultConsumerGroup is the consumer group of a topic when neither
// ConsumerGroup nor GenerateConsumerGroup is set: "watermill_" + topic.
func DefaultConsumerGroup(topic string) string { return "watermill_" + topic }

// SubscriberConfig configures a Subscriber. Exactly one of Client and
// NameServers must be set.
type SubscriberConfig struct {
	// Client is the RocketMQ client to consume through. The Subscriber does
	// not own it: Close leaves it open, and the caller closes it after the
	// Subscriber. A Client is ONE member of each consumer group it joins.
	Client *client.Client
	// NameServers, when Client is nil, are the name server addresses of a
	// Client the Subscriber creates (with ClientOptions), owns and closes in
	// Close.
	NameServers []string
	// ClientOptions are passed to client.New with NameServers.
	ClientOptions []client.Option

	// ConsumerGroup is a fixed consumer group for every topic. RocketMQ
	// requires all members of a group to subscribe the same topics, so a
	// fixed group suits one topic per group; prefer GenerateConsumerGroup
	// when subscribing several topics.
	ConsumerGroup string
	// GenerateConsumerGroup derives the group from the topic
	// (DefaultConsumerGroup when both are unset). Exclusive with
	// ConsumerGroup.
	GenerateConsumerGroup func(topic string) string
	// GroupOptions are passed to client.NewGroupConsumer (allocation
	// strategy, rebalance interval, …). The listener is the Subscriber's.
	GroupOptions []client.GroupOption

	// InitialOffset is where a group without a committed offset starts
	// (OffsetFirst).
	InitialOffset InitialOffset
	// Unmarshaler turns pulled messages into watermill messages
	// (DefaultMarshaler{} when nil). A message it fails on is skipped: the
	// error is logged at Error level with the queue and offset, and the
	// offset counts as consumed.
	Unmarshaler Unmarshaler

	// PullBatchSize is the most messages one pull returns
	// (DefaultPullBatchSize).
	PullBatchSize int
	// PollTimeout is how long the broker holds a pull that finds nothing
	// (long polling; DefaultPollTimeout).
	PollTimeout time.Duration
	// CommitInterval is how often a queue's acknowledged offset is committed
	// to the broker while messages are processed (DefaultCommitInterval).
	// Offsets are also committed with every pull and when a queue is revoked
	// or the subscription ends.
	CommitInterval time.Duration
	// NackResendDelay is the wait before a nacked message is delivered again
	// in-process; it doubles with every further nack of the message up to
	// NackResendMaxDelay (defaults 10 ms and 100 ms).
	NackResendDelay    time.Duration
	NackResendMaxDelay time.Duration
	// SendBackAfterAttempts, when > 0, hands a message nacked that many
	// times in a row back to the broker (CONSUMER_SEND_MSG_BACK, RocketMQ's
	// retry path) with delay level SendBackDelayLevel and treats it as
	// consumed; the subscription also consumes the group's retry topic
	// (%RETRY%<group>), so the message comes back after the delay (to any
	// member of the group), its reconsume count up. Past the group's max
	// reconsume times (client.WithMaxReconsumeTimes in GroupOptions, 16 by
	// default) the broker moves it to %DLQ%<group> instead. 0 = redeliver
	// in-process forever. The retry topic is per group: use it with groups that
	// consume one topic (the default GenerateConsumerGroup).
	SendBackAfterAttempts int
	// SendBackDelayLevel is the delay level of sent-back messages (the
	// broker's table: 1 = 1 s, 2 = 5 s, 3 = 10 s, …; default 3).
	SendBackDelayLevel int

	// TopicQueueNums is the queue count SubscribeInitialize gives a topic it
	// creates (DefaultTopicQueueNums). With 1, a topic's messages are
	// delivered in publish order.
	TopicQueueNums int
	// TopicCluster is the cluster (or a broker address) SubscribeInitialize
	// creates topics on (DefaultTopicCluster).
	TopicCluster string
	// DoNotCreateTopics makes Subscribe fail on a topic no name server knows
	// instead of creating it as SubscribeInitialize does.
	DoNotCreateTopics bool
	// InitializeTimeout bounds SubscribeInitialize and the group join of
	// Subscribe (DefaultInitializeTimeout).
	InitializeTimeout time.Duration
	// OperationTimeout bounds offset queries, commits and send-backs
	// (DefaultOperationTimeout).
	OperationTimeout time.Duration
}

func (c *SubscriberConfig) setDefaults() {
	if c.ConsumerGroup == "" && c.GenerateConsumerGroup == nil {
		c.GenerateConsumerGroup = DefaultConsumerGroup
	}
	if c.Unmarshaler == nil {
		c.Unmarshaler = DefaultMarshaler{}
	}
	setDefault(&c.PullBatchSize, DefaultPullBatchSize)
	setDefault(&c.PollTimeout, DefaultPollTimeout)
	setDefault(&c.CommitInterval, DefaultCommitInterval)
	setDefault(&c.NackResendDelay, DefaultNackResendDelay)
	setDefault(&c.NackResendMaxDelay, DefaultNackResendMaxDelay)
	setDefault(&c.SendBackDelayLevel, DefaultSendBackDelayLevel)
	setDefault(&c.TopicQueueNums, DefaultTopicQueueNums)
	setDefault(&c.TopicCluster, DefaultTopicCluster)
	setDefault(&c.InitializeTimeout, DefaultInitializeTimeout)
	setDefault(&c.OperationTimeout, DefaultOperationTimeout)
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate checks the configuration (after defaults are applied).
func (c *SubscriberConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Client == nil && len(c.NameServers) == 0:
		return bad("Client or NameServers is required")
	case c.Client != nil && len(c.NameServers) > 0:
		return bad("Client and NameServers are exclusive")
	case c.Client != nil && len(c.ClientOptions) > 0:
		return bad("ClientOptions need NameServers")
	case c.ConsumerGroup != "" && c.GenerateConsumerGroup != nil:
		return bad("ConsumerGroup and GenerateConsumerGroup are exclusive")
	case c.InitialOffset != OffsetFirst && c.InitialOffset != OffsetLast:
		return bad("InitialOffset %d", c.InitialOffset)
	case c.PullBatchSize < 1 || c.PullBatchSize > 1024:
		return bad("PullBatchSize %d outside [1, 1024]", c.PullBatchSize)
	case c.PollTimeout < 0 || c.CommitInterval < 0 || c.NackResendDelay < 0 || c.InitializeTimeout < 0 || c.OperationTimeout < 0:
		return bad("negative duration")
	case c.NackResendMaxDelay < c.NackResendDelay:
		return bad("NackResendMaxDelay %v below NackResendDelay %v", c.NackResendMaxDelay, c.NackResendDelay)
	case c.SendBackAfterAttempts < 0:
		return bad("negative SendBackAfterAttempts")
	case c.SendBackDelayLevel < 0 || c.SendBackDelayLevel > 18:
		return bad("SendBackDelayLevel %d outside [1, 18]", c.SendBackDelayLevel)
	case c.TopicQueueNums < 1 || c.TopicQueueNums > 1024:
		return bad("TopicQueueNums %d outside [1, 1024]", c.TopicQueueNums)
	}
	return nil
}

// Subscriber is a watermill message.Subscriber (and SubscribeInitializer)
// that consumes RocketMQ topics in consumer groups through runnel's client.
// Its methods are safe for concurrent use.
//
// Each Subscribe joins the topic's consumer group with a
// client.GroupConsumer and reads every queue assigned to this member on its
// own goroutine, with long polling. Messages of one queue are delivered one
// at a time: the next is sent only after the previous one was acked, so a
// topic with one queue (or messages with one sharding key) is consumed in
// order. Ack makes the message's offset committable: the committed offset
// of a queue is its contiguous low watermark (everything below was acked),
// stored on the broker with every pull, every CommitInterval and when the
// queue is revoked or the subscription ends. Nack delivers the message
// again after NackResendDelay (doubling per nack), or sends it to the retry
// topic after SendBackAfterAttempts nacks.
//
// Delivery is at least once: after a crash, a rebalance or a close, a
// message that was delivered but not acked is delivered again (to this
// member or another).
type Subscriber struct {
	cfg    SubscriberConfig
	logger watermill.LoggerAdapter
	c      *client.Client
	ownsC  bool

	// life is the Subscriber's own lifetime (not a caller's ctx): Close
	// cancels it, which ends every subscription and pending operation.
	life     context.Context
	shutdown context.CancelFunc
	wg       sync.WaitGroup // one teardown goroutine per subscription
	mu       struct {
		sync.Mutex
		closed bool
		groups map[string]bool // groups with an active subscription
	}
	closeOnce sync.Once
	closeErr  error
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber validates cfg and returns a Subscriber. logger may be nil
// (watermill.NopLogger).
func NewSubscriber(cfg SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	s := &Subscriber{cfg: cfg, logger: logger, c: cfg.Client}
	s.life, s.shutdown = context.WithCancel(context.Background())
	s.mu.groups = map[string]bool{}
	if s.c == nil {
		c, err := client.New(append([]client.Option{client.WithNameServers(cfg.NameServers...)}, cfg.ClientOptions...)...)
		if err != nil {
			s.shutdown()
			return nil, fmt.Errorf("watermill: subscriber client: %w", err)
		}
		s.c, s.ownsC = c, true
	}
	return s, nil
}

func (s *Subscriber) group(topic string) string {
	if s.cfg.GenerateConsumerGroup != nil {
		return s.cfg.GenerateConsumerGroup(topic)
	}
	return s.cfg.ConsumerGroup
}

// SubscribeInitialize creates topic with TopicQueueNums queues on
// TopicCluster (UPDATE_AND_CREATE_TOPIC, which leaves an existing topic's
// messages alone) and waits until the name servers route it. With
// SendBackAfterAttempts it also creates the group's retry topic. It blocks
// up to InitializeTimeout.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := s.opCtx(context.Background(), s.cfg.InitializeTimeout)
	defer cancel()
	return s.initialize(ctx, topic)
}

func (s *Subscriber) initialize(ctx context.Context, topic string) error {
	if s.isClosed() {
		return ErrSubscriberClosed
	}
	if err := s.createTopic(ctx, topic, s.cfg.TopicQueueNums); err != nil {
		return err
	}
	if s.cfg.SendBackAfterAttempts > 0 {
		return s.createTopic(ctx, retryTopic(s.group(topic)), 1)
	}
	return nil
}

func retryTopic(group string) string { return "%RETRY%" + group }

func (s *Subscriber) createTopic(ctx context.Context, topic string, queues int) error {
	tc := client.TopicConfig{TopicName: topic, ReadQueueNums: int32(queues), WriteQueueNums: int32(queues),
		Perm: protocol.PermRead | protocol.PermWrite}
	if err := s.c.CreateTopic(ctx, s.cfg.TopicCluster, tc); err != nil {
		return fmt.Errorf("watermill: create topic %s: %w", topic, err)
	}
	return s.waitRoute(ctx, topic)
}

// waitRoute polls the name servers until they route topic.
func (s *Subscriber) waitRoute(ctx context.Context, topic string) error {
	delay := 5 * time.Millisecond
	for {
		r, err := s.c.RefreshRoute(ctx, topic)
		if err == nil && len(r.SubscribeQueues()) > 0 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("watermill: topic %s has no readable queue yet", topic)
		}
		if !sleepCtx(ctx, delay) {
			return fmt.Errorf("watermill: wait for the route of %s: %w", topic, errors.Join(ctx.Err(), err))
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// opCtx returns a ctx bounded by d that also ends when the Subscriber
// closes.
func (s *Subscriber) opCtx(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() { stop(); cancel() }
}

func (s *Subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.closed
}
