package client

import (
	"bytes"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// Producer defaults.
const (
	// DefaultRetries is how many times a failed synchronous send is retried,
	// preferring another broker (RocketMQ's retryTimesWhenSendFailed).
	DefaultRetries = 2
	// DefaultMaxBodySize bounds a message body, or a batch's bodies together
	// (the broker's maxMessageSize, 4 MiB).
	DefaultMaxBodySize = 4 << 20
	// DefaultTopicQueueNums is the queue count asked for when the broker
	// creates a topic on its first send.
	DefaultTopicQueueNums = 4
	// MaxTopicLength is the longest topic name a producer accepts.
	MaxTopicLength = 127
	// MaxGroupLength is the longest group name accepted.
	MaxGroupLength = 255
)

// Message is a message to send. The producer reads it during Send (and until
// SendAsync returns) and never modifies or retains it.
type Message struct {
	Topic string
	Body  []byte
	// Tags is the message tag (TAGS property) consumers filter on; "" = none.
	Tags string
	// Keys are business keys (KEYS property, space-separated on the wire;
	// keys must not contain spaces).
	Keys []string
	// Properties are user properties. Names the client sets itself (TAGS,
	// KEYS, UNIQ_KEY, DELAY, …) are refused.
	Properties map[string]string
	// DelayLevel delays delivery by the broker's level table (1 = 1 s, 2 = 5 s,
	// 3 = 10 s, … 18 = 2 h); 0 = none.
	DelayLevel int
	// DeliverTime asks RocketMQ 5 timer brokers to deliver at this time
	// (TIMER_DELIVER_MS); zero = none. Exclusive with DelayLevel and
	// DeliverAfter.
	DeliverTime time.Time
	// DeliverAfter asks RocketMQ 5 timer brokers to deliver this long after
	// they stored the message, by the broker's clock: TIMER_DELAY_SEC when it
	// is a whole number of seconds, else TIMER_DELAY_MS (Java's
	// setDelayTimeSec and setDelayTimeMs); zero = none. Exclusive with
	// DelayLevel and DeliverTime. Brokers without timers (4.x) deliver at once.
	DeliverAfter time.Duration
	// ShardingKey orders messages: HashBySharding sends equal keys to one
	// queue. It is also carried as the __SHARDINGKEY (Java) and SHARDING_KEY
	// (rocketmq-client-go) properties.
	ShardingKey string
	// Queue, when non-nil, is the queue to send to (no selector, no
	// failover to another queue).
	Queue *protocol.MessageQueue
	// Flag is the user flag stored with the message.
	Flag int32
}

// SendStatus is the outcome of a successful send: the message is stored,
// with an optional caveat about durability.
type SendStatus int

// Send statuses (response codes 0, 10, 12, 11).
const (
	SendOK SendStatus = iota
	SendFlushDiskTimeout
	SendFlushSlaveTimeout
	SendSlaveNotAvailable
)

// String returns the RocketMQ name of s.
func (s SendStatus) String() string {
	switch s {
	case SendOK:
		return "SEND_OK"
	case SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	}
	return "SendStatus(" + strconv.Itoa(int(s)) + ")"
}

// SendResult describes a stored message (or batch).
type SendResult struct {
	Status SendStatus
	// MsgID is the UNIQ_KEY the producer gave the message; for a batch, the
	// ids of its messages joined by commas.
	MsgID string
	// OffsetMsgID is the broker's offset message id (comma-separated for a
	// batch).
	OffsetMsgID string
	// Queue is where the message was stored; QueueOffset its logical offset
	// (of the first message, for a batch).
	Queue       protocol.MessageQueue
	QueueOffset int64
	// TransactionID is the broker's transaction id (= UNIQ_KEY).
	TransactionID string
	// RegionID is the broker's region (MSG_REGION), "DefaultRegion" if absent.
	RegionID string
	// BrokerAddr is the address the message was sent to.
	BrokerAddr string
}

// ProducerOption configures NewProducer.
type ProducerOption interface{ applyProducer(*producerConfig) }

type producerOptionFunc func(*producerConfig)

func (f producerOptionFunc) applyProducer(c *producerConfig) { f(c) }

type producerConfig struct {
	retries        int
	selector       QueueSelector
	compressOver   int
	compressLevel  int
	maxBody        int
	sendTimeout    time.Duration
	defQueueNums   int32
	faultEnabled   bool
	latencyMax     []time.Duration
	notAvailable   []time.Duration
	checkListener  func(ctx context.Context, msg *protocol.MessageExt) TxState
	checkListenSet bool
}

// WithRetries sets how many times a failed synchronous send is retried
// (DefaultRetries). Retries prefer another broker. Oneway sends retry only
// when no connection could be made; asynchronous sends never retry.
func WithRetries(n int) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.retries = n })
}

// WithSelector sets how a queue is chosen (default RoundRobin with latency
// fault tolerance). A custom selector (HashBySharding, SelectorFunc) is used
// for every attempt, so retries go to the queue it picks again.
func WithSelector(s QueueSelector) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.selector = s })
}

// WithCompression compresses single-message bodies of at least threshold
// bytes with zlib at level (default 4096 and 5, as RocketMQ clients do);
// threshold <= 0 disables compression. Batches are never compressed.
func WithCompression(threshold, level int) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.compressOver, c.compressLevel = threshold, level })
}

// WithMaxBodySize bounds a body, or a batch's bodies together
// (DefaultMaxBodySize); larger sends are refused before sending.
func WithMaxBodySize(n int) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.maxBody = n })
}

// WithSendTimeout bounds each send attempt whose ctx has no earlier deadline
// (default: the Client's request timeout).
func WithSendTimeout(d time.Duration) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.sendTimeout = d })
}

// WithDefaultTopicQueueNums sets the queue count asked for when a send
// creates a topic on the broker (DefaultTopicQueueNums).
func WithDefaultTopicQueueNums(n int) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.defQueueNums = int32(n) })
}

// WithLatencyFaultTolerance turns RocketMQ's MQFaultStrategy on (default)
// or off: brokers that answered slowly or failed are avoided for a while,
// and the least bad one is used when all are avoided.
func WithLatencyFaultTolerance(on bool) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) { c.faultEnabled = on })
}

// WithFaultTables replaces the fault strategy's tables: a send latency of at
// least latencyMax[i] (the largest such i) makes its broker unavailable for
// notAvailable[i]. Defaults: {50ms, 100ms, 550ms, 1s, 2s, 3s, 15s} →
// {0, 0, 30s, 1m, 2m, 3m, 10m}. A failed send counts as 10 s of latency.
func WithFaultTables(latencyMax, notAvailable []time.Duration) ProducerOption {
	return producerOptionFunc(func(c *producerConfig) {
		c.latencyMax, c.notAvailable = append([]time.Duration(nil), latencyMax...), append([]time.Duration(nil), notAvailable...)
	})
}

func defaultProducerConfig() producerConfig {
	return producerConfig{
		retries:       DefaultRetries,
		compressOver:  protocol.CompressBodyOverHowMuch,
		compressLevel: protocol.DefaultCompressLevel,
		maxBody:       DefaultMaxBodySize,
		defQueueNums:  DefaultTopicQueueNums,
		faultEnabled:  true,
		latencyMax:    defaultLatencyMax,
		notAvailable:  defaultNotAvailable,
	}
}

func (c *producerConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
	}
	switch {
	case c.retries < 0 || c.retries > 100:
		return bad("retries %d outside [0, 100]", c.retries)
	case c.compressOver > 0 && (c.compressLevel < zlib.HuffmanOnly || c.compressLevel > zlib.BestCompression):
		return bad("compression level %d", c.compressLevel)
	case c.maxBody < 1 || c.maxBody > protocol.MaxBodySize:
		return bad("max body size %d outside [1, %d]", c.maxBody, protocol.MaxBodySize)
	case c.sendTimeout < 0:
		return bad("send timeout %v", c.sendTimeout)
	case c.defQueueNums < 1 || c.defQueueNums > 1024:
		return bad("default topic queue nums %d outside [1, 1024]", c.defQueueNums)
	case len(c.latencyMax) == 0 || len(c.latencyMax) != len(c.notAvailable):
		return bad("fault tables must be non-empty and of equal length")
	case c.checkListenSet && c.checkListener == nil:
		return bad("nil check listener")
	}
	return nil
}

// Producer sends messages for one producer group through a Client. It is
// safe for concurrent use; concurrent Send and SendAsync calls pipeline on
// the broker connections (one connection per broker, many requests in
// flight). Close unregisters it; closing the Client stops it too.
type Producer struct {
	c     *Client
	group string
	cfg   producerConfig
	fault *faultStrategy
	rr    atomic.Uint32

	cmds   sync.Pool // *protocol.Command
	asyncs sync.Pool // *asyncSend
	ends   sync.Pool // *asyncEnd
	bufs   sync.Pool // *[]byte
	zws    sync.Pool // *zlib.Writer

	unregister  func()
	removeCheck func()
	closed      atomic.Bool
	hbSent      sync.Map // broker address → struct{}: heartbeat sent (transactions)
}

// NewProducer returns a Producer of group on c. The group is announced to
// brokers by the Client's heartbeats (transaction check-backs find the
// producer through it).
func NewProducer(c *Client, group string, opts ...ProducerOption) (*Producer, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	}
	if err := validateName("producer group", group, MaxGroupLength); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	cfg := defaultProducerConfig()
	for _, o := range opts {
		if o != nil {
			o.applyProducer(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	p := &Producer{c: c, group: group, cfg: cfg, fault: newFaultStrategy(cfg.faultEnabled, cfg.latencyMax, cfg.notAvailable)}
	p.cmds.New = func() any { return protocol.NewRequest(0) }
	p.asyncs.New = p.newAsyncSend
	p.ends.New = p.newAsyncEnd
	p.bufs.New = func() any { b := make([]byte, 0, 512); return &b }
	p.unregister = c.registerProducer(group)
	if cfg.checkListener != nil {
		p.removeCheck = c.handleServerRequest(protocol.ReqCheckTransactionState, p.handleCheck)
	}
	return p, nil
}

// Group returns the producer group.
func (p *Producer) Group() string { return p.group }

// Close unregisters the producer from heartbeats and check-backs. It does
// not wait for asynchronous sends in flight (their callbacks still run).
// Idempotent.
func (p *Producer) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.unregister()
	if p.removeCheck != nil {
		p.removeCheck()
	}
	return nil
}

// outbound is a validated, encoded send: one message or a batch.
type outbound struct {
	topic   string
	body    []byte
	props   string
	sysFlag int32
	flag    int32
	batch   bool
	reply   bool // a reply (MSG_TYPE=reply): SEND_REPLY_MESSAGE_V2
	msgID   string
	queue   *protocol.MessageQueue
	first   *Message
	buf     *[]byte // pooled backing of body, when the producer built it
}

func (p *Producer) getBuf() *[]byte { return p.bufs.Get().(*[]byte) }

func (p *Producer) putBuf(b *[]byte) {
	if b != nil && cap(*b) <= 1<<20 {
		*b = (*b)[:0]
		p.bufs.Put(b)
	}
}

func (p *Producer) release(ob *outbound) { p.putBuf(ob.buf); ob.buf = nil }

// Send sends one message, or a batch of messages to one topic, and waits
// until the broker stored it. A failed attempt is retried (WithRetries) on
// another queue, preferring another broker, when the failure is a transport
// error or a retryable broker reply. ctx bounds the whole call; without a
// deadline each attempt gets the send timeout.
//
// Errors: ErrInvalidMessage (nothing sent), ErrNoRoute, a *protocol.Error
// reply, or a transport error; MaybeApplied(err) tells whether the message
// may have been stored anyway.
func (p *Producer) Send(ctx context.Context, msgs ...*Message) (res SendResult, err error) {
	var ob outbound
	var inject []string
	if p.c.cfg.hooks.sendHooked() { // hooks.go
		ctx, inject = p.beforeSend(ctx, msgs)
		defer func() { p.afterSend(ctx, sendTopic(msgs), len(msgs), res, err) }()
	}
	if err := p.prepare(&ob, msgs, false, inject...); err != nil {
		return SendResult{}, err
	}
	defer p.release(&ob)
	return p.sendSync(ctx, &ob, false)
}

// SendAsync sends like Send, without waiting for the broker: cb is called
// exactly once with the result. It blocks only to validate, resolve the
// route and wait for room on the connection (bounded by ctx); ctx also
// bounds the wait for the response (without a deadline, the send timeout).
// There is no retry. cb runs on the connection's reader goroutine (or on
// the caller's when the send fails early) and must not block; it must not
// call Client.Close.
func (p *Producer) SendAsync(ctx context.Context, cb func(SendResult, error), msgs ...*Message) {
	var ob outbound
	var inject []string
	if p.c.cfg.hooks.sendHooked() { // hooks.go
		ctx, inject = p.beforeSend(ctx, msgs)
		hctx, topic, n, userCB := ctx, sendTopic(msgs), len(msgs), cb
		cb = func(res SendResult, err error) { p.afterSend(hctx, topic, n, res, err); userCB(res, err) }
	}
	if err := p.prepare(&ob, msgs, false, inject...); err != nil {
		cb(SendResult{}, err)
		return
	}
	defer p.release(&ob)
	q, addr, err := p.pick(ctx, &ob, "")
	if err != nil {
		cb(SendResult{}, err)
		return
	}
	p.sendPickedAsync(ctx, &ob, q, addr, cb, nil)
}

// sendPickedAsync sends ob to queue q at addr without waiting, with one
// attempt: cb (a plain send) or half (a half message, given its handle)
// gets the outcome on the connection's reader goroutine (or at once when
// the connection cannot be had).
func (p *Producer) sendPickedAsync(ctx context.Context, ob *outbound, q protocol.MessageQueue, addr string, cb func(SendResult, error), half HalfCallback) {
	now := time.Now()
	a := p.asyncs.Get().(*asyncSend)
	a.cb, a.half, a.q, a.addr, a.msgID, a.start = cb, half, q, addr, ob.msgID, now
	if half != nil {
		a.topic = ob.topic
	}
	cn, err := p.c.conn(ctx, addr)
	if err != nil {
		a.finish(nil, err)
		return
	}
	cmd := p.buildCmd(ob, q, now)
	p.c.sign(cmd)
	cn.InvokeAsyncTimeout(ctx, cmd, p.attemptTimeout(ctx), a.onResponse)
	p.putCmd(cmd)
}

// asyncSend is a SendAsync awaiting its response: what the response
// callback needs, pooled with that callback bound once (onResponse), so
// that an asynchronous send allocates no closure.
type asyncSend struct {
	p          *Producer
	cb         func(SendResult, error)
	half       HalfCallback // instead of cb for a half message
	topic      string       // of the half message (its handle's)
	q          protocol.MessageQueue
	addr       string
	msgID      string
	start      time.Time
	onResponse func(*protocol.Command, error) // a.response, bound once
}

func (p *Producer) newAsyncSend() any {
	a := &asyncSend{p: p}
	a.onResponse = a.response
	return a
}

// response is the remoting callback: a transport error comes after the
// request was handed to the connection (sentError: maybe stored).
func (a *asyncSend) response(resp *protocol.Command, err error) {
	if err != nil {
		err = &sentError{addr: a.addr, err: err}
	}
	a.finish(resp, err)
}

// finish records the attempt with the fault strategy, returns a to its
// pool and calls the user's callback.
func (a *asyncSend) finish(resp *protocol.Command, err error) {
	p, cb, half, topic, q, addr, msgID := a.p, a.cb, a.half, a.topic, a.q, a.addr, a.msgID
	lat := time.Since(a.start)
	a.cb, a.half, a.topic, a.q, a.addr, a.msgID = nil, nil, "", protocol.MessageQueue{}, "", ""
	p.asyncs.Put(a)
	if err != nil {
		p.fault.update(q.BrokerName, lat, true)
		if half != nil {
			half.HalfSent(TxHandle{}, sendErr(err))
			return
		}
		cb(SendResult{}, sendErr(err))
		return
	}
	p.fault.update(q.BrokerName, lat, false)
	res, err := sendResult(resp, msgID, q, addr)
	if half != nil {
		if err != nil {
			half.HalfSent(TxHandle{}, err)
			return
		}
		half.HalfSent(p.halfHandle(topic, res))
		return
	}
	cb(res, err)
}

// SendOneway sends without asking for an answer: it returns once the
// request is queued on the connection, and there is no telling whether the
// broker stored it. Only connection failures are retried.
func (p *Producer) SendOneway(ctx context.Context, msgs ...*Message) (retErr error) {
	var ob outbound
	var inject []string
	if p.c.cfg.hooks.sendHooked() { // hooks.go
		ctx, inject = p.beforeSend(ctx, msgs)
		defer func() { p.afterSend(ctx, sendTopic(msgs), len(msgs), SendResult{}, retErr) }()
	}
	if err := p.prepare(&ob, msgs, false, inject...); err != nil {
		return err
	}
	defer p.release(&ob)
	last := ""
	var err error
	for range p.cfg.retries + 1 {
		var q protocol.MessageQueue
		var addr string
		q, addr, err = p.pick(ctx, &ob, last)
		if err != nil {
			return err
		}
		cmd := p.buildCmd(&ob, q, time.Now())
		err = p.c.invokeOneway(ctx, addr, cmd)
		p.putCmd(cmd)
		if err == nil {
			return nil
		}
		var u *unreachableError
		if !errors.As(err, &u) || ctx.Err() != nil {
			break
		}
		p.fault.update(q.BrokerName, 0, true)
		last = q.BrokerName
	}
	return err
}

// attemptTimeout returns the timeout of one send attempt: the send timeout
// (or the request timeout), or 0 when ctx's deadline comes first and so
// bounds the attempt alone.
func (p *Producer) attemptTimeout(ctx context.Context) time.Duration {
	d := p.cfg.sendTimeout
	if d == 0 {
		d = p.c.cfg.requestTimeout
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return 0
	}
	return d
}

// sendSync runs the attempts of a synchronous send. half restricts retries
// to failures after which the message surely was not stored.
func (p *Producer) sendSync(ctx context.Context, ob *outbound, half bool) (SendResult, error) {
	if p.closed.Load() {
		return SendResult{}, ErrClosed
	}
	var (
		last   string
		unsure bool
		err    error
	)
	for attempt := 0; attempt <= p.cfg.retries; attempt++ {
		if attempt > 0 && ctx.Err() != nil {
			break
		}
		var q protocol.MessageQueue
		var addr string
		q, addr, err = p.pick(ctx, ob, last)
		if err != nil {
			break
		}
		var res SendResult
		res, err = p.attempt(ctx, ob, q, addr)
		if err == nil {
			return res, nil
		}
		if MaybeApplied(err) {
			unsure = true
		}
		if ctxDone(ctx, err) || !(isTransport(err) || protocol.IsRetryable(err)) || (half && unsure) {
			break
		}
		last = q.BrokerName
	}
	if unsure && !MaybeApplied(err) {
		err = &unsureError{err: err}
	}
	return SendResult{}, err
}

// attempt sends ob to queue q at addr once.
func (p *Producer) attempt(ctx context.Context, ob *outbound, q protocol.MessageQueue, addr string) (SendResult, error) {
	start := time.Now()
	cmd := p.buildCmd(ob, q, start)
	resp, err := p.c.invokeTimeout(ctx, addr, cmd, p.attemptTimeout(ctx))
	p.putCmd(cmd)
	lat := time.Since(start)
	if err != nil {
		p.fault.update(q.BrokerName, lat, true)
		return SendResult{}, sendErr(err)
	}
	p.fault.update(q.BrokerName, lat, false)
	return sendResult(resp, ob.msgID, q, addr)
}

// sendErr marks transport errors after which the message may be stored.
func sendErr(err error) error {
	var s *sentError
	if errors.As(err, &s) {
		return &unsureError{err: err}
	}
	return err
}

func sendResult(resp *protocol.Command, msgID string, q protocol.MessageQueue, addr string) (SendResult, error) {
	res := SendResult{MsgID: msgID, Queue: q, BrokerAddr: addr}
	switch resp.Code {
	case protocol.ResSuccess:
		res.Status = SendOK
	case protocol.ResFlushDiskTimeout:
		res.Status = SendFlushDiskTimeout
	case protocol.ResFlushSlaveTimeout:
		res.Status = SendFlushSlaveTimeout
	case protocol.ResSlaveNotAvailable:
		res.Status = SendSlaveNotAvailable
	default:
		return SendResult{}, fmt.Errorf("client: send to %s (%s): %w", addr, q, protocol.ResponseError(resp))
	}
	var h protocol.SendMessageResponseHeader
	if err := h.Decode(resp); err != nil {
		return SendResult{}, fmt.Errorf("client: send to %s: response: %w", addr, err)
	}
	res.OffsetMsgID = h.MsgID
	res.Queue.QueueID = h.QueueID
	res.QueueOffset = h.QueueOffset
	res.TransactionID = h.TransactionID
	res.RegionID = h.MsgRegion
	if res.RegionID == "" {
		res.RegionID = "DefaultRegion"
	}
	return res, nil
}

// pick resolves the route and chooses the queue and broker address of the
// next attempt, avoiding broker last when possible.
func (p *Producer) pick(ctx context.Context, ob *outbound, last string) (protocol.MessageQueue, string, error) {
	route, err := p.c.publishRoute(ctx, ob.topic, p.cfg.defQueueNums)
	if err != nil {
		return protocol.MessageQueue{}, "", err
	}
	qs := route.publish
	if len(qs) == 0 {
		return protocol.MessageQueue{}, "", fmt.Errorf("%w: topic %q has no writable queue", ErrNoRoute, ob.topic)
	}
	var q protocol.MessageQueue
	switch {
	case ob.queue != nil:
		q = *ob.queue
	case p.cfg.selector != nil && !isRoundRobin(p.cfg.selector):
		q = p.cfg.selector.Select(ob.first, qs)
	default:
		q = p.fault.pick(qs, p.rr.Add(1), last)
	}
	q.Topic = ob.topic
	addr, ok := route.masters[q.BrokerName]
	if !ok {
		return q, "", fmt.Errorf("%w: broker %q of queue %s has no master", ErrNoRoute, q.BrokerName, q)
	}
	return q, addr, nil
}

func (p *Producer) putCmd(cmd *protocol.Command) {
	cmd.Body = nil
	cmd.ResetExt()
	p.cmds.Put(cmd)
}

// buildCmd encodes ob as a SEND_MESSAGE_V2 (single) or SEND_BATCH_MESSAGE
// request to queue q, born at now.
func (p *Producer) buildCmd(ob *outbound, q protocol.MessageQueue, now time.Time) *protocol.Command {
	cmd := p.cmds.Get().(*protocol.Command)
	cmd.Code = protocol.ReqSendMessageV2
	cmd.Flag, cmd.Opaque, cmd.Remark = 0, 0, ""
	h := protocol.SendMessageRequestHeaderV2{
		ProducerGroup:         p.group,
		Topic:                 ob.topic,
		DefaultTopic:          DefaultTopic,
		DefaultTopicQueueNums: p.cfg.defQueueNums,
		QueueID:               q.QueueID,
		SysFlag:               ob.sysFlag,
		BornTimestamp:         now.UnixMilli(),
		Flag:                  ob.flag,
		Properties:            ob.props,
		ReconsumeTimes:        protocol.Some[int32](0),
		UnitMode:              protocol.Some(false),
		BrokerName:            q.BrokerName,
	}
	if ob.batch {
		cmd.Code = protocol.ReqSendBatchMessage
		h.Batch = protocol.Some(true)
	} else if ob.reply {
		cmd.Code = protocol.ReqSendReplyMessageV2 // request.go
	}
	h.Encode(cmd)
	cmd.Body = ob.body
	return cmd
}

// --- validation and encoding ---

// notAllowedSendTopics are system topics a producer must not send to (Java
// TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET).
var notAllowedSendTopics = [...]string{
	"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
	"TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
}

// reservedProp reports whether name is a property the producer sets
// itself; user properties must not use them (a switch: checked for every
// property of every message sent).
func reservedProp(name string) bool {
	switch name {
	case protocol.PropTags, protocol.PropKeys, protocol.PropUniqKey, protocol.PropDelayLevel,
		protocol.PropTransactionPrepared, protocol.PropProducerGroup, protocol.PropTimerDeliverMS,
		protocol.PropTimerDelaySec, protocol.PropTimerDelayMS, protocol.PropShardingKeyJava, protocol.PropShardingKey,
		protocol.PropRealTopic, protocol.PropRealQueueID, protocol.PropTransactionID,
		protocol.PropRetryTopic, protocol.PropWaitStoreMsgOK:
		return true
	}
	return false
}

// validateName checks a topic or group name: 1..maxLen characters from
// [%|a-zA-Z0-9_-].
func validateName(what, s string, maxLen int) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(s) > maxLen {
		return fmt.Errorf("%s %q is longer than %d characters", what, s, maxLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '%' || c == '|' || c == '_' || c == '-') {
			return fmt.Errorf("%s %q contains %q: only [%%|a-zA-Z0-9_-] are allowed", what, s, c)
		}
	}
	return nil
}

// ValidateMessage checks m the way Send does before sending anything: topic
// name, body size, properties. The error wraps ErrInvalidMessage.
func ValidateMessage(m *Message, maxBody int) error {
	if m == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if err := validateName("topic", m.Topic, MaxTopicLength); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	for _, t := range notAllowedSendTopics {
		if m.Topic == t {
			return fmt.Errorf("%w: sending to system topic %q is forbidden", ErrInvalidMessage, m.Topic)
		}
	}
	switch {
	case len(m.Body) == 0:
		return fmt.Errorf("%w: empty body", ErrInvalidMessage)
	case len(m.Body) > maxBody:
		return fmt.Errorf("%w: body of %d bytes exceeds %d", ErrInvalidMessage, len(m.Body), maxBody)
	case m.DelayLevel < 0 || m.DelayLevel > 99:
		return fmt.Errorf("%w: delay level %d outside [0, 99]", ErrInvalidMessage, m.DelayLevel)
	case m.DeliverAfter < 0:
		return fmt.Errorf("%w: negative DeliverAfter %v", ErrInvalidMessage, m.DeliverAfter)
	case (m.DelayLevel > 0 && !m.DeliverTime.IsZero()) || (m.DeliverAfter > 0 && (m.DelayLevel > 0 || !m.DeliverTime.IsZero())):
		return fmt.Errorf("%w: DelayLevel, DeliverTime and DeliverAfter are exclusive", ErrInvalidMessage)
	}
	if m.Tags != "" {
		if err := protocol.ValidateProperty(protocol.PropTags, m.Tags); err != nil {
			return fmt.Errorf("%w: tags: %w", ErrInvalidMessage, err)
		}
	}
	if m.ShardingKey != "" {
		if err := protocol.ValidateProperty(protocol.PropShardingKeyJava, m.ShardingKey); err != nil {
			return fmt.Errorf("%w: sharding key: %w", ErrInvalidMessage, err)
		}
	}
	for _, k := range m.Keys {
		if err := protocol.ValidateProperty(protocol.PropKeys, k); err != nil || bytes.IndexByte([]byte(k), ' ') >= 0 {
			return fmt.Errorf("%w: key %q must be non-empty, without spaces or separators", ErrInvalidMessage, k)
		}
	}
	for k, v := range m.Properties {
		if err := validateUserProperty(k, v); err != nil {
			return err
		}
	}
	if q := m.Queue; q != nil && (q.QueueID < 0 || q.BrokerName == "" || (q.Topic != "" && q.Topic != m.Topic)) {
		return fmt.Errorf("%w: queue override %s does not name a queue of topic %q", ErrInvalidMessage, *q, m.Topic)
	}
	return nil
}

// validateUserProperty checks a property a caller sets: carried on the
// wire, and not one the producer sets itself.
func validateUserProperty(k, v string) error {
	if err := protocol.ValidateProperty(k, v); err != nil {
		return fmt.Errorf("%w: property %q: %w", ErrInvalidMessage, k, err)
	}
	if reservedProp(k) {
		return fmt.Errorf("%w: property %q is set by the producer", ErrInvalidMessage, k)
	}
	return nil
}

// validatePairs checks name/value pairs given beside a message's
// Properties (SendHalfWith) as ValidateMessage checks those.
func validatePairs(kv []string) error {
	if len(kv)%2 != 0 {
		return fmt.Errorf("%w: %d strings are not name/value pairs", ErrInvalidMessage, len(kv))
	}
	for i := 0; i < len(kv); i += 2 {
		if err := validateUserProperty(kv[i], kv[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// appendMsgProps appends m's properties (user properties, TAGS, KEYS,
// DELAY, TIMER_DELIVER_MS, TIMER_DELAY_SEC or TIMER_DELAY_MS, __SHARDINGKEY
// and SHARDING_KEY, then UNIQ_KEY = id and extra) to dst.
func appendMsgProps(dst []byte, m *Message, id []byte, extra ...string) []byte {
	for k, v := range m.Properties {
		dst = protocol.AppendProperty(dst, k, v)
	}
	if m.Tags != "" {
		dst = protocol.AppendProperty(dst, protocol.PropTags, m.Tags)
	}
	if len(m.Keys) > 0 {
		dst = append(dst, protocol.PropKeys...)
		dst = append(dst, protocol.PropNameValueSeparator)
		for i, k := range m.Keys {
			if i > 0 {
				dst = append(dst, ' ')
			}
			dst = append(dst, k...)
		}
		dst = append(dst, protocol.PropSeparator)
	}
	if m.DelayLevel > 0 {
		dst = append(dst, protocol.PropDelayLevel...)
		dst = append(dst, protocol.PropNameValueSeparator)
		dst = strconv.AppendInt(dst, int64(m.DelayLevel), 10)
		dst = append(dst, protocol.PropSeparator)
	}
	if !m.DeliverTime.IsZero() {
		dst = append(dst, protocol.PropTimerDeliverMS...)
		dst = append(dst, protocol.PropNameValueSeparator)
		dst = strconv.AppendInt(dst, m.DeliverTime.UnixMilli(), 10)
		dst = append(dst, protocol.PropSeparator)
	}
	if d := m.DeliverAfter; d > 0 {
		if d%time.Second == 0 {
			dst = append(dst, protocol.PropTimerDelaySec...)
			dst = append(dst, protocol.PropNameValueSeparator)
			dst = strconv.AppendInt(dst, int64(d/time.Second), 10)
		} else {
			dst = append(dst, protocol.PropTimerDelayMS...)
			dst = append(dst, protocol.PropNameValueSeparator)
			dst = strconv.AppendInt(dst, max(d.Milliseconds(), 1), 10)
		}
		dst = append(dst, protocol.PropSeparator)
	}
	if m.ShardingKey != "" {
		// Under both names: Java's, and the one rocketmq-client-go reads.
		dst = protocol.AppendProperty(dst, protocol.PropShardingKeyJava, m.ShardingKey)
		dst = protocol.AppendProperty(dst, protocol.PropShardingKey, m.ShardingKey)
	}
	dst = append(dst, protocol.PropUniqKey...)
	dst = append(dst, protocol.PropNameValueSeparator)
	dst = append(dst, id...)
	dst = append(dst, protocol.PropSeparator)
	for i := 0; i+1 < len(extra); i += 2 {
		dst = protocol.AppendProperty(dst, extra[i], extra[i+1])
	}
	return dst
}

// prepare validates msgs and encodes them into ob. half marks a
// transactional half message (single only). inject are property name/value
// pairs added to every message (from HookProduce).
func (p *Producer) prepare(ob *outbound, msgs []*Message, half bool, inject ...string) error {
	if p.closed.Load() || p.c.closed.Load() {
		return ErrClosed
	}
	if len(msgs) == 0 {
		return fmt.Errorf("%w: no message", ErrInvalidMessage)
	}
	for _, m := range msgs {
		if err := ValidateMessage(m, p.cfg.maxBody); err != nil {
			return err
		}
	}
	m := msgs[0]
	*ob = outbound{topic: m.Topic, flag: m.Flag, queue: m.Queue, first: m}
	ob.reply = len(msgs) == 1 && m.Properties[protocol.PropMsgType] == replyMessageFlag
	idLen := p.c.uniq.Len()
	if len(msgs) == 1 {
		// The pairs after UNIQ_KEY, in an array on the stack.
		var kv [20]string
		extra := kv[:0]
		if half {
			if m.DelayLevel > 0 || !m.DeliverTime.IsZero() || m.DeliverAfter > 0 {
				return fmt.Errorf("%w: transactional messages cannot be delayed", ErrInvalidMessage)
			}
			extra = append(extra, protocol.PropTransactionPrepared, "true", protocol.PropProducerGroup, p.group)
			ob.sysFlag |= protocol.SysFlagTransactionPrepared
		}
		extra = append(extra, inject...)
		sb := p.getBuf()
		var idb [56]byte
		id := p.c.uniq.AppendNext(idb[:0])
		b := appendMsgProps((*sb)[:0], m, id, extra...)
		if len(b) > protocol.MaxPropertiesLength {
			*sb = b
			p.putBuf(sb)
			return fmt.Errorf("%w: properties of %d bytes exceed %d", ErrInvalidMessage, len(b), protocol.MaxPropertiesLength)
		}
		ob.props = string(b)
		*sb = b
		p.putBuf(sb)
		// UNIQ_KEY's value sits right before the trailing extras.
		at := len(ob.props) - 1 - idLen
		for i := 0; i+1 < len(extra); i += 2 {
			at -= len(extra[i]) + len(extra[i+1]) + 2
		}
		ob.msgID = ob.props[at : at+idLen]
		ob.body = m.Body
		if p.cfg.compressOver > 0 && len(m.Body) >= p.cfg.compressOver {
			if err := p.compress(ob); err != nil {
				return err
			}
		}
		return nil
	}
	// Batch: one topic, no delay, no per-message queue.
	total := 0
	for _, bm := range msgs {
		switch {
		case bm.Topic != m.Topic:
			return fmt.Errorf("%w: a batch goes to one topic (%q and %q)", ErrInvalidMessage, m.Topic, bm.Topic)
		case bm.DelayLevel > 0 || !bm.DeliverTime.IsZero() || bm.DeliverAfter > 0:
			return fmt.Errorf("%w: delayed messages cannot be batched", ErrInvalidMessage)
		case (bm.Queue == nil) != (m.Queue == nil) || (bm.Queue != nil && *bm.Queue != *m.Queue):
			return fmt.Errorf("%w: a batch goes to one queue", ErrInvalidMessage)
		}
		total += len(bm.Body)
	}
	if total > p.cfg.maxBody {
		return fmt.Errorf("%w: batch bodies of %d bytes exceed %d", ErrInvalidMessage, total, p.cfg.maxBody)
	}
	if len(m.Topic) >= len("%RETRY%") && m.Topic[:len("%RETRY%")] == "%RETRY%" {
		return fmt.Errorf("%w: batches cannot go to retry topics", ErrInvalidMessage)
	}
	ids := make([]byte, 0, len(msgs)*(idLen+1))
	bb := p.getBuf()
	body := (*bb)[:0]
	scratch := p.getBuf()
	for i, bm := range msgs {
		if i > 0 {
			ids = append(ids, ',')
		}
		start := len(ids)
		ids = p.c.uniq.AppendNext(ids)
		pb := appendMsgProps((*scratch)[:0], bm, ids[start:], inject...)
		*scratch = pb
		if len(pb) > protocol.MaxPropertiesLength {
			*bb = body
			p.putBuf(bb)
			p.putBuf(scratch)
			return fmt.Errorf("%w: batch message %d: properties of %d bytes exceed %d", ErrInvalidMessage, i, len(pb), protocol.MaxPropertiesLength)
		}
		var err error
		body, err = protocol.AppendBatchItem(body, bm.Flag, bm.Body, unsafe.String(unsafe.SliceData(pb), len(pb)))
		if err != nil {
			*bb = body
			p.putBuf(bb)
			p.putBuf(scratch)
			return fmt.Errorf("%w: batch message %d: %w", ErrInvalidMessage, i, err)
		}
	}
	p.putBuf(scratch)
	*bb = body
	ob.buf, ob.body, ob.batch, ob.flag = bb, body, true, 0
	ob.msgID = unsafe.String(unsafe.SliceData(ids), len(ids))
	return nil
}

// compress replaces ob.body with its zlib compression when that is smaller.
func (p *Producer) compress(ob *outbound) error {
	bb := p.getBuf()
	buf := bytes.NewBuffer((*bb)[:0])
	zw, _ := p.zws.Get().(*zlib.Writer)
	if zw == nil {
		var err error
		if zw, err = zlib.NewWriterLevel(buf, p.cfg.compressLevel); err != nil {
			p.putBuf(bb)
			return fmt.Errorf("client: compress: %w", err)
		}
	} else {
		zw.Reset(buf)
	}
	_, err := zw.Write(ob.body)
	if err == nil {
		err = zw.Close()
	}
	p.zws.Put(zw)
	if err != nil {
		p.putBuf(bb)
		return fmt.Errorf("client: compress: %w", err)
	}
	out := buf.Bytes()
	*bb = out
	if len(out) >= len(ob.body) {
		p.putBuf(bb)
		return nil
	}
	ob.buf, ob.body = bb, out
	ob.sysFlag |= protocol.SysFlagCompressed | protocol.SysFlagCompressionZlib
	return nil
}
