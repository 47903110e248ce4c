package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// PopConsumer is RocketMQ 5's pop-mode push consumer (Java's
// DefaultMQPushConsumer with clientRebalance=false on a POP assignment):
// the brokers balance the queues, so members need no rebalance and no
// queue locks, and a slow or dead member holds only the messages it
// popped, until their invisible time passes.
//
// With a ConcurrentHandler one loop per broker of each subscribed topic
// pops every queue of that broker (queue id -1), with long polling, and
// hands the messages to WithConsumeWorkers workers in batches of up to
// WithConsumeBatchSize. A consumed message is acked; a failed one is made
// invisible for the retry delay of its reconsume count
// (CHANGE_MESSAGE_INVISIBLETIME; Java's popDelayLevel, 10 s, 30 s, 1 min,
// … 2 h; WithPopRetryDelays) and comes back through the group's pop retry
// topic with its count up; a message that failed WithMaxReconsumeTimes
// times (16) goes to the group's dead-letter topic (CONSUMER_SEND_MSG_BACK
// with delay level -1) and is acked. A message whose invisible time passed
// before a worker took it is not consumed here (the broker hands it out
// again), as Java's consumer drops a timed-out pop.
//
// With an OrderlyHandler one loop per queue pops orderly (the broker hands
// out a queue's next batch only once the previous one is acked) and
// calls the handler with each batch in queue order; a failed batch is made
// invisible for WithSuspendTime and comes again, in order, its reconsume
// count up; past WithMaxReconsumeTimes (unlimited by default) a message is
// dead-lettered and acked.
//
// Routes are looked up at Start and every WithRebalanceInterval: a new
// broker or queue gets its loop. Subscribe, Start, Shutdown and Close are
// safe for concurrent use.
type PopConsumer struct {
	c       *Client
	group   string
	cfg     popConsumerConfig
	mode    pushMode
	conc    ConcurrentHandler
	orderly OrderlyHandler
	log     *slog.Logger
	hooks   *clientHooks

	runCtx    context.Context
	stopRun   context.CancelFunc
	handleCtx context.Context
	stopCalls context.CancelFunc
	work      chan []*poppedMsg
	wg        sync.WaitGroup
	life      sync.Mutex

	mu struct {
		sync.Mutex
		state      int
		subs       map[string]Selector
		loops      map[protocol.MessageQueue]bool // running pop loops
		unregister func()
	}
}

// poppedMsg is a message in a PopConsumer: what the handler sees and the
// receipt handle.
type poppedMsg struct {
	cm       ConsumedMessage
	pm       PoppedMessage
	deadline time.Time // pop time + invisible time
}

// popConsumerConfig holds the PopConsumer's options.
type popConsumerConfig struct {
	invisible     time.Duration
	batch         int32
	poll          time.Duration
	workers       int
	consumeBatch  int
	suspend       time.Duration
	maxReconsume  int32
	retryDelays   []time.Duration
	routeInterval time.Duration
	fromFirst     bool
}

// PopOption configures a PopConsumer.
type PopOption interface{ applyPop(*popConsumerConfig) }

type popOptionFunc func(*popConsumerConfig)

func (f popOptionFunc) applyPop(c *popConsumerConfig) { f(c) }

// WithPopInvisibleTime sets the invisible time of the messages popped
// (DefaultPopInvisibleTime, 1 min; the handler must finish within it).
func WithPopInvisibleTime(d time.Duration) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.invisible = d })
}

// WithPopBatchSize sets the messages asked for per pop (1..MaxPopMsgs, 32).
func WithPopBatchSize(n int) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.batch = int32(n) })
}

// WithPopPollTime sets how long a broker holds a pop that finds nothing
// (DefaultPushSuspend, 15 s).
func WithPopPollTime(d time.Duration) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.poll = d })
}

// WithPopWorkers sets the concurrent handler's workers
// (DefaultConsumeWorkers).
func WithPopWorkers(n int) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.workers = n })
}

// WithPopConsumeBatchSize sets the most messages per concurrent handler
// call (DefaultConsumeBatchSize).
func WithPopConsumeBatchSize(n int) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.consumeBatch = n })
}

// WithPopSuspendTime sets how long a failed orderly batch stays invisible
// (DefaultSuspendTime).
func WithPopSuspendTime(d time.Duration) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.suspend = d })
}

// WithPopMaxReconsumeTimes sets after how many failed deliveries a message
// is dead-lettered (DefaultMaxReconsumeTimes for concurrent handlers,
// unlimited for orderly ones).
func WithPopMaxReconsumeTimes(n int) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.maxReconsume = int32(n) })
}

// WithPopRetryDelays sets the invisible time of a failed message by its
// reconsume count (the last one for higher counts); Java's popDelayLevel
// by default.
func WithPopRetryDelays(d ...time.Duration) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.retryDelays = slices.Clone(d) })
}

// WithPopRouteInterval sets how often routes are looked up for new brokers
// and queues (DefaultRebalanceInterval).
func WithPopRouteInterval(d time.Duration) PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.routeInterval = d })
}

// WithPopFromFirst makes a group without an offset start at the queues'
// first messages (ConsumeInitMode MIN) instead of their end.
func WithPopFromFirst() PopOption {
	return popOptionFunc(func(c *popConsumerConfig) { c.fromFirst = true })
}

// popDelayLevels is Java's DefaultMQPushConsumerImpl.popDelayLevel (s).
var popDelayLevels = []int{10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200}

// NewPopConsumer returns a PopConsumer of group on c calling h (a
// ConcurrentHandler or an OrderlyHandler). Nothing is sent until Start;
// the PopConsumer does not own c: close it before c.
func NewPopConsumer(c *Client, group string, h Handler, opts ...PopOption) (*PopConsumer, error) {
	if c == nil {
		return nil, errors.New("client: nil Client")
	}
	if group == "" {
		return nil, fmt.Errorf("%w: empty consumer group", ErrInvalidOption)
	}
	pc := &PopConsumer{c: c, group: group, log: c.log, hooks: &c.cfg.hooks}
	switch h := h.(type) {
	case ConcurrentHandler:
		if h == nil {
			return nil, errors.New("client: nil handler")
		}
		pc.mode, pc.conc = modeConcurrent, h
	case OrderlyHandler:
		if h == nil {
			return nil, errors.New("client: nil handler")
		}
		pc.mode, pc.orderly = modeOrderly, h
	default:
		return nil, errors.New("client: the handler must be a ConcurrentHandler or an OrderlyHandler")
	}
	cfg := popConsumerConfig{invisible: DefaultPopInvisibleTime, batch: MaxPopMsgs, poll: DefaultPushSuspend,
		workers: DefaultConsumeWorkers, consumeBatch: DefaultConsumeBatchSize, suspend: DefaultSuspendTime,
		maxReconsume: -1, routeInterval: DefaultRebalanceInterval}
	for _, d := range popDelayLevels {
		cfg.retryDelays = append(cfg.retryDelays, time.Duration(d)*time.Second)
	}
	for _, o := range opts {
		o.applyPop(&cfg)
	}
	switch {
	case cfg.invisible <= 0 || cfg.poll < 0 || cfg.suspend < 0 || cfg.routeInterval <= 0:
		return nil, fmt.Errorf("%w: negative or zero pop consumer duration", ErrInvalidOption)
	case cfg.batch < 1 || cfg.batch > MaxPopMsgs:
		return nil, fmt.Errorf("%w: pop batch size %d outside 1..%d", ErrInvalidOption, cfg.batch, MaxPopMsgs)
	case cfg.workers < 1 || cfg.consumeBatch < 1:
		return nil, fmt.Errorf("%w: pop workers %d, consume batch %d", ErrInvalidOption, cfg.workers, cfg.consumeBatch)
	case len(cfg.retryDelays) == 0:
		return nil, fmt.Errorf("%w: no pop retry delays", ErrInvalidOption)
	}
	if cfg.maxReconsume < 0 {
		cfg.maxReconsume = DefaultMaxReconsumeTimes
		if pc.mode == modeOrderly {
			cfg.maxReconsume = 1<<31 - 1
		}
	}
	pc.cfg = cfg
	pc.mu.subs = map[string]Selector{}
	pc.mu.loops = map[protocol.MessageQueue]bool{}
	return pc, nil
}

// Subscribe adds (or replaces) the subscription of topic; before Start
// only.
func (pc *PopConsumer) Subscribe(topic string, sel Selector) error {
	if _, err := sel.subscription(topic, 0); err != nil {
		return err
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.mu.state != 0 {
		return ErrPushStarted
	}
	pc.mu.subs[topic] = sel
	return nil
}

// Start registers the group in the client's heartbeats (CONSUME_POP),
// looks up the subscribed topics' routes and starts the pop loops and
// workers. ctx bounds the first heartbeat and route lookups.
func (pc *PopConsumer) Start(ctx context.Context) error {
	pc.life.Lock()
	defer pc.life.Unlock()
	pc.mu.Lock()
	if pc.mu.state != 0 {
		pc.mu.Unlock()
		return ErrPushStarted
	}
	if len(pc.mu.subs) == 0 {
		pc.mu.Unlock()
		return fmt.Errorf("%w: no subscription", ErrInvalidOption)
	}
	pc.mu.state = 1
	pc.mu.unregister = pc.c.registerConsumer(pc.group, pc.consumerData)
	pc.mu.Unlock()
	pc.runCtx, pc.stopRun = context.WithCancel(context.Background())
	pc.handleCtx, pc.stopCalls = context.WithCancel(context.Background())
	if err := pc.c.heartbeatNow(ctx); err != nil {
		pc.log.Warn("client: pop consumer's first heartbeat failed", "group", pc.group, "err", err)
	}
	if err := pc.refreshLoops(ctx); err != nil {
		pc.stop()
		return err
	}
	if pc.mode == modeConcurrent {
		pc.work = make(chan []*poppedMsg, pc.cfg.workers)
		for range pc.cfg.workers {
			pc.wg.Add(1)
			go pc.worker()
		}
	}
	pc.wg.Add(1)
	go pc.routeLoop()
	return nil
}

func (pc *PopConsumer) consumerData() protocol.ConsumerData {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	cd := protocol.ConsumerData{GroupName: pc.group, ConsumeType: protocol.ConsumePop,
		MessageModel: protocol.MessageModelClustering, ConsumeFromWhere: protocol.ConsumeFromLastOffset}
	if pc.cfg.fromFirst {
		cd.ConsumeFromWhere = protocol.ConsumeFromFirstOffset
	}
	for topic, sel := range pc.mu.subs {
		if sd, err := sel.subscription(topic, 0); err == nil {
			cd.SubscriptionDataSet = append(cd.SubscriptionDataSet, sd)
		}
	}
	slices.SortFunc(cd.SubscriptionDataSet, func(a, b protocol.SubscriptionData) int { return strings.Compare(a.Topic, b.Topic) })
	return cd
}

// refreshLoops starts a pop loop for every broker (concurrent) or queue
// (orderly) of the subscribed topics that has none.
func (pc *PopConsumer) refreshLoops(ctx context.Context) error {
	pc.mu.Lock()
	subs := make(map[string]Selector, len(pc.mu.subs))
	for t, s := range pc.mu.subs {
		subs[t] = s
	}
	pc.mu.Unlock()
	var errs []error
	for topic, sel := range subs {
		r, err := pc.c.RefreshRoute(ctx, topic)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var targets []protocol.MessageQueue
		if pc.mode == modeOrderly {
			targets = r.SubscribeQueues()
		} else {
			for _, b := range r.BrokerNames() {
				targets = append(targets, protocol.MessageQueue{Topic: topic, BrokerName: b, QueueID: -1})
			}
		}
		pc.mu.Lock()
		for _, q := range targets {
			if pc.mu.loops[q] || pc.mu.state != 1 {
				continue
			}
			pc.mu.loops[q] = true
			pc.wg.Add(1)
			go pc.popLoop(q, sel)
		}
		pc.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (pc *PopConsumer) routeLoop() {
	defer pc.wg.Done()
	t := time.NewTicker(pc.cfg.routeInterval)
	defer t.Stop()
	for {
		select {
		case <-pc.runCtx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(pc.runCtx, 10*time.Second)
		if err := pc.refreshLoops(ctx); err != nil && pc.runCtx.Err() == nil {
			pc.log.Warn("client: pop consumer route lookup failed", "group", pc.group, "err", err)
		}
		cancel()
	}
}

// popLoop pops q until the consumer stops.
func (pc *PopConsumer) popLoop(q protocol.MessageQueue, sel Selector) {
	defer pc.wg.Done()
	ctx := pc.runCtx
	bo := backoff.Policy{Initial: 100 * time.Millisecond, Max: 3 * time.Second}
	failures := 0
	req := PopRequest{Queue: q, Group: pc.group, MaxMsgs: pc.cfg.batch, InvisibleTime: pc.cfg.invisible,
		PollTime: pc.cfg.poll, Selector: sel, Order: pc.mode == modeOrderly, FromFirst: pc.cfg.fromFirst}
	for ctx.Err() == nil {
		res, err := pc.c.Pop(ctx, req)
		if err != nil || res.Status == PopPollingFull {
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				pc.log.Warn("client: pop failed", "group", pc.group, "queue", q, "err", err)
			}
			if backoff.Sleep(ctx, bo.Delay(failures)) != nil {
				return
			}
			failures++
			continue
		}
		failures = 0
		if len(res.Messages) == 0 {
			continue
		}
		msgs := make([]*poppedMsg, len(res.Messages))
		for i := range res.Messages {
			m := &poppedMsg{pm: res.Messages[i]}
			m.cm = ConsumedMessage{MessageExt: m.pm.MessageExt,
				Queue: protocol.MessageQueue{Topic: q.Topic, BrokerName: m.pm.Handle.BrokerName, QueueID: m.pm.Handle.QueueID}}
			m.deadline = time.UnixMilli(m.pm.Handle.PopTime).Add(time.Duration(m.pm.Handle.InvisibleTime) * time.Millisecond)
			msgs[i] = m
		}
		if pc.mode == modeOrderly {
			// After a failure the queue stays blocked for the suspend
			// time: pop again once it passed.
			if !pc.consumeOrderly(msgs) && backoff.Sleep(ctx, pc.cfg.suspend) != nil {
				return
			}
			continue
		}
		for len(msgs) > 0 {
			n := min(len(msgs), pc.cfg.consumeBatch)
			select {
			case pc.work <- msgs[:n]:
			case <-ctx.Done():
				return // not consumed: the broker hands them out again
			}
			msgs = msgs[n:]
		}
	}
}

// worker runs concurrent handler calls until the consumer stops.
func (pc *PopConsumer) worker() {
	defer pc.wg.Done()
	for {
		select {
		case <-pc.runCtx.Done():
			return
		case batch := <-pc.work:
			pc.consumeConcurrently(batch)
		}
	}
}

// consumeConcurrently calls the handler with batch and acks or retries
// each message (Java ConsumeMessagePopConcurrentlyService).
func (pc *PopConsumer) consumeConcurrently(batch []*poppedMsg) {
	now := time.Now()
	live := batch[:0]
	for _, m := range batch {
		if now.Before(m.deadline) {
			live = append(live, m)
		}
	}
	if len(live) == 0 {
		return
	}
	cms := make([]*ConsumedMessage, len(live))
	for i, m := range live {
		cms[i] = &m.cm
	}
	err := pc.callHandler(cms)
	ctx, cancel := context.WithTimeout(context.Background(), sendBackTimeout)
	defer cancel()
	for _, m := range live {
		if err == nil && m.cm.Result == ConsumeSuccess {
			pc.ack(ctx, m)
			continue
		}
		if m.pm.ReconsumeTimes >= pc.cfg.maxReconsume || m.cm.DelayLevel < 0 {
			pc.deadLetter(ctx, m)
			continue
		}
		idx := int(m.pm.ReconsumeTimes)
		if m.cm.DelayLevel > 0 {
			idx = m.cm.DelayLevel - 1
		}
		d := pc.cfg.retryDelays[min(idx, len(pc.cfg.retryDelays)-1)]
		if cerr := pc.c.ChangeInvisibleTime(ctx, &m.pm, d); cerr != nil {
			// It comes back anyway once its invisible time passes.
			pc.log.Warn("client: pop change invisible time failed", "group", pc.group, "msgId", m.pm.MsgID(), "err", cerr)
		}
	}
}

// consumeOrderly calls the handler with one orderly batch and acks it; a
// failed batch is made invisible for the suspend time (the loop pops it
// again, its counts up) and false returned.
func (pc *PopConsumer) consumeOrderly(batch []*poppedMsg) bool {
	cms := make([]*ConsumedMessage, 0, len(batch))
	var dead []*poppedMsg
	for _, m := range batch {
		if m.pm.ReconsumeTimes > pc.cfg.maxReconsume {
			dead = append(dead, m)
			continue
		}
		cms = append(cms, &m.cm)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sendBackTimeout)
	defer cancel()
	for _, m := range dead {
		pc.deadLetter(ctx, m)
	}
	if len(cms) == 0 {
		return true
	}
	err := pc.callHandler(cms)
	for _, m := range batch {
		if slices.Contains(dead, m) {
			continue
		}
		if err == nil {
			pc.ack(ctx, m)
			continue
		}
		if cerr := pc.c.ChangeInvisibleTime(ctx, &m.pm, pc.cfg.suspend); cerr != nil {
			pc.log.Warn("client: pop change invisible time failed", "group", pc.group, "msgId", m.pm.MsgID(), "err", cerr)
		}
	}
	return err == nil
}

func (pc *PopConsumer) ack(ctx context.Context, m *poppedMsg) {
	if err := pc.c.Ack(ctx, &m.pm); err != nil {
		// It comes back once its invisible time passes (at least once).
		pc.log.Warn("client: pop ack failed", "group", pc.group, "msgId", m.pm.MsgID(), "err", err)
	}
}

// deadLetter sends m to the group's dead-letter topic and acks it.
func (pc *PopConsumer) deadLetter(ctx context.Context, m *poppedMsg) {
	q := protocol.MessageQueue{Topic: m.pm.Topic, BrokerName: m.pm.Handle.BrokerName, QueueID: m.pm.Handle.QueueID}
	if err := pc.c.consumerSendBack(ctx, pc.group, &m.pm.MessageExt, q, -1, pc.cfg.maxReconsume); err != nil {
		pc.log.Warn("client: pop dead-lettering failed; the message comes back", "group", pc.group, "msgId", m.pm.MsgID(), "err", err)
		return
	}
	pc.ack(ctx, m)
}

// callHandler prepares msgs (contexts from the consume hooks), calls the
// handler (a panic is an error) and tells the consumed hooks.
func (pc *PopConsumer) callHandler(msgs []*ConsumedMessage) (err error) {
	ctx := pc.handleCtx
	for _, m := range msgs {
		m.Result, m.DelayLevel, m.ctx = ConsumeSuccess, 0, ctx
		for _, h := range pc.hooks.consume {
			m.ctx = h.OnConsume(m.ctx, pc.group, &m.MessageExt)
		}
	}
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != nil {
				pc.log.Error("client: pop consumer handler panicked; its messages are retried", "panic", r,
					"stack", string(debug.Stack()))
				err = fmt.Errorf("client: handler panicked: %v", r)
			}
		}()
		if pc.mode == modeOrderly {
			err = pc.orderly(ctx, msgs)
		} else {
			err = pc.conc(ctx, msgs)
		}
	}()
	took := time.Since(start)
	for _, m := range msgs {
		r := m.Result
		if err != nil {
			r = ConsumeRetryLater
		}
		for _, h := range pc.hooks.consumed {
			h.OnConsumed(m.Context(), pc.group, &m.MessageExt, r, took)
		}
	}
	return err
}

// Shutdown stops popping, lets the handler calls in progress finish
// (until ctx ends: then their contexts are cancelled) and unregisters the
// group. Messages popped and not yet consumed are not acked: the brokers
// hand them out again after their invisible time. Later calls return
// ErrPushClosed.
func (pc *PopConsumer) Shutdown(ctx context.Context) error {
	pc.life.Lock()
	defer pc.life.Unlock()
	pc.mu.Lock()
	state := pc.mu.state
	pc.mu.state = 2
	pc.mu.Unlock()
	switch state {
	case 0:
		return nil
	case 2:
		return ErrPushClosed
	}
	pc.stopRun()
	done := make(chan struct{})
	go func() { pc.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		pc.stopCalls()
		<-done
	}
	pc.stop()
	return ctx.Err()
}

// stop cancels everything and unregisters the group (after the
// goroutines ended, or when Start failed).
func (pc *PopConsumer) stop() {
	pc.stopRun()
	pc.stopCalls()
	pc.wg.Wait()
	pc.mu.Lock()
	pc.mu.state = 2
	unregister := pc.mu.unregister
	pc.mu.unregister = nil
	pc.mu.Unlock()
	if unregister != nil {
		unregister()
	}
}

// Close stops at once: handler calls in progress get a cancelled context
// and are waited for. It is idempotent.
func (pc *PopConsumer) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := pc.Shutdown(ctx); err != nil && !errors.Is(err, ErrPushClosed) && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
