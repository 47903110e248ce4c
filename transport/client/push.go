package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// PushConsumer defaults (RocketMQ's DefaultMQPushConsumer).
const (
	DefaultPullBatchSize       = 32
	DefaultPullThresholdMsgs   = 1000
	DefaultPullThresholdBytes  = 100 << 20
	DefaultConsumeMaxSpan      = 2000
	DefaultConsumeBatchSize    = 1
	DefaultConsumeWorkers      = 20
	DefaultConsumeTimeout      = 15 * time.Minute
	DefaultSuspendTime         = time.Second
	DefaultPersistInterval     = 5 * time.Second
	DefaultPushSuspend         = 15 * time.Second
	DefaultRevokeWait          = time.Second
	DefaultConsumeFromTimeBack = 30 * time.Minute
)

// Internal delays of the push consumer (RocketMQ's).
const (
	flowControlDelay  = 50 * time.Millisecond // a queue over its thresholds
	pullErrorDelay    = 3 * time.Second       // PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION
	localRetryDelay   = 5 * time.Second       // a message whose send-back failed
	maxOrderlyRun     = time.Minute           // MAX_TIME_CONSUME_CONTINUOUSLY
	orderlyYieldDelay = 10 * time.Millisecond
)

// Errors of PushConsumer.
var (
	// ErrPushStarted is returned by Subscribe and Start after Start.
	ErrPushStarted = errors.New("client: push consumer already started")
	// ErrPushClosed is returned after Shutdown or Close.
	ErrPushClosed = errors.New("client: push consumer closed")
)

// ConsumeResult is a concurrent handler's verdict on one message.
type ConsumeResult int8

const (
	// ConsumeSuccess: the message is consumed (the default).
	ConsumeSuccess ConsumeResult = iota
	// ConsumeRetryLater: the message is sent back to the broker and
	// delivered again later (clustering; broadcasting drops it, as
	// RocketMQ does).
	ConsumeRetryLater
)

// String returns the RocketMQ name of r.
func (r ConsumeResult) String() string {
	if r == ConsumeRetryLater {
		return "RECONSUME_LATER"
	}
	return "CONSUME_SUCCESS"
}

// ConsumedMessage is a message delivered to a PushConsumer's handler. Its
// MessageExt aliases the pull response it came in (clone what you keep
// past the handler). For a message that came back through the group's
// retry topic Topic is the original topic again (RETRY_TOPIC), as Java's
// consumer shows it, and Queue is the retry topic's queue.
type ConsumedMessage struct {
	protocol.MessageExt
	// Queue is the queue the message was pulled from.
	Queue protocol.MessageQueue
	// Result is the concurrent handler's verdict (ConsumeSuccess unless
	// set); a handler's error makes every message of the call
	// ConsumeRetryLater.
	Result ConsumeResult
	// DelayLevel is the delay of a ConsumeRetryLater send-back: 0 lets the
	// broker choose (3 + ReconsumeTimes: 10 s, 30 s, 1 min, …), a level
	// 1–18 sets it, -1 sends the message to the dead-letter topic at once.
	DelayLevel int

	ctx context.Context
}

// Context returns the message's context: the handler's ctx, with what the
// client's HookConsume hooks added (the trace the producer propagated).
func (m *ConsumedMessage) Context() context.Context {
	if m.ctx == nil {
		return context.Background()
	}
	return m.ctx
}

// Handler is what a PushConsumer calls with messages: a ConcurrentHandler
// or an OrderlyHandler.
type Handler interface{ pushMode() pushMode }

type pushMode int8

const (
	modeConcurrent pushMode = iota
	modeOrderly
)

// ConcurrentHandler consumes messages in any order, on up to
// WithConsumeWorkers goroutines at once, in batches of up to
// WithConsumeBatchSize messages of one queue. Per message it sets Result
// (ConsumeSuccess by default); returning an error retries the whole batch.
// ctx ends when the consume timeout passes (the messages are then sent
// back whatever the handler returns) or when the consumer stops without
// waiting. A panic counts as an error (RocketMQ treats a listener's
// exception so) and is logged with its stack.
type ConcurrentHandler func(ctx context.Context, msgs []*ConsumedMessage) error

func (ConcurrentHandler) pushMode() pushMode { return modeConcurrent }

// OrderlyHandler consumes the messages of each queue in queue order, one
// batch of one queue at a time, while this consumer holds the queue's
// broker lock (clustering). Returning an error (or panicking) suspends the
// queue for WithSuspendTime and delivers the same batch again, its
// messages' ReconsumeTimes counted up; a message that failed
// WithMaxReconsumeTimes times (unlimited by default) is sent to the retry
// topic with its count, where the broker dead-letters it, and the queue
// moves on. Result and DelayLevel are ignored.
type OrderlyHandler func(ctx context.Context, msgs []*ConsumedMessage) error

func (OrderlyHandler) pushMode() pushMode { return modeOrderly }

// ConsumeFrom says where a group that has no committed offset for a queue
// starts consuming it.
type ConsumeFrom struct {
	where string
	at    time.Time
}

// Where a group without a committed offset starts.
var (
	// ConsumeFromLast starts at the queue's end: only messages stored
	// from now on (RocketMQ's default, CONSUME_FROM_LAST_OFFSET).
	ConsumeFromLast = ConsumeFrom{where: protocol.ConsumeFromLastOffset}
	// ConsumeFromFirst starts at the queue's first message.
	ConsumeFromFirst = ConsumeFrom{where: protocol.ConsumeFromFirstOffset}
)

// ConsumeFromTimestamp starts at the first message stored at or after t.
func ConsumeFromTimestamp(t time.Time) ConsumeFrom {
	return ConsumeFrom{where: protocol.ConsumeFromTimestamp, at: t}
}

// pushConfig holds the PushConsumer-only options (inside groupConfig).
type pushConfig struct {
	from            ConsumeFrom
	pullBatch       int
	pullInterval    time.Duration
	suspend         time.Duration
	queueMaxMsgs    int
	queueMaxBytes   int64
	maxSpan         int64
	batchMax        int
	workers         int
	consumeTimeout  time.Duration
	suspendTime     time.Duration
	persistInterval time.Duration
	offsetFile      string
	revokeWait      time.Duration
	localRetry      time.Duration // a failed send-back's local re-consumption delay
}

func defaultPushConfig() pushConfig {
	return pushConfig{
		from:            ConsumeFromLast,
		pullBatch:       DefaultPullBatchSize,
		suspend:         DefaultPushSuspend,
		queueMaxMsgs:    DefaultPullThresholdMsgs,
		queueMaxBytes:   DefaultPullThresholdBytes,
		maxSpan:         DefaultConsumeMaxSpan,
		batchMax:        DefaultConsumeBatchSize,
		workers:         DefaultConsumeWorkers,
		consumeTimeout:  DefaultConsumeTimeout,
		suspendTime:     DefaultSuspendTime,
		persistInterval: DefaultPersistInterval,
		revokeWait:      DefaultRevokeWait,
		localRetry:      localRetryDelay,
	}
}

func (p *pushConfig) validate() error {
	switch {
	case p.pullBatch < 1 || p.pullBatch > 1024:
		return fmt.Errorf("client: pull batch size %d outside [1, 1024]", p.pullBatch)
	case p.pullInterval < 0 || p.suspend < 0 || p.revokeWait < 0:
		return errors.New("client: negative pull interval, suspend or revoke wait")
	case p.queueMaxMsgs < 1 || p.queueMaxBytes < 1 || p.maxSpan < 1:
		return errors.New("client: pull thresholds must be positive")
	case p.batchMax < 1 || p.batchMax > 1024:
		return fmt.Errorf("client: consume batch size %d outside [1, 1024]", p.batchMax)
	case p.workers < 1 || p.workers > 1000:
		return fmt.Errorf("client: consume workers %d outside [1, 1000]", p.workers)
	case p.consumeTimeout <= 0 || p.suspendTime <= 0 || p.persistInterval <= 0:
		return errors.New("client: consume timeout, suspend time and persist interval must be positive")
	case p.from.where == "":
		return errors.New("client: no ConsumeFrom")
	}
	return nil
}

func pushOption(f func(*pushConfig)) GroupOption {
	return groupOptionFunc(func(c *groupConfig) { f(&c.push) })
}

// WithConsumeFrom sets where a PushConsumer starts on queues its group has
// no committed offset for (ConsumeFromLast by default). Retry topics start
// at their first message (ConsumeFromLast, ConsumeFromFirst) or their end
// (timestamps), as RocketMQ's do.
func WithConsumeFrom(f ConsumeFrom) GroupOption {
	return pushOption(func(p *pushConfig) { p.from = f })
}

// WithPullBatchSize sets how many messages one pull of a PushConsumer asks
// for (DefaultPullBatchSize).
func WithPullBatchSize(n int) GroupOption { return pushOption(func(p *pushConfig) { p.pullBatch = n }) }

// WithPullInterval makes a PushConsumer wait d between two pulls of a
// queue (0, the default: pull again at once; the broker long-polls).
func WithPullInterval(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.pullInterval = d })
}

// WithPullSuspend sets how long the broker may hold a PushConsumer's pull
// that finds nothing (long polling; DefaultPushSuspend, Java's 15 s).
func WithPullSuspend(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.suspend = d })
}

// WithPullThresholds sets a PushConsumer's flow control per queue: it
// stops pulling a queue (and tries again 50 ms later) while more than
// msgs messages or bytes of body of it are pulled and not consumed, or
// (concurrent handlers) while the offsets in process span more than span
// (defaults 1000, 100 MiB, 2000).
func WithPullThresholds(msgs int, bytes int64, span int64) GroupOption {
	return pushOption(func(p *pushConfig) { p.queueMaxMsgs, p.queueMaxBytes, p.maxSpan = msgs, bytes, span })
}

// WithConsumeBatchSize sets the most messages a handler call gets
// (DefaultConsumeBatchSize, 1).
func WithConsumeBatchSize(n int) GroupOption {
	return pushOption(func(p *pushConfig) { p.batchMax = n })
}

// WithConsumeWorkers sets how many handler calls run at once
// (DefaultConsumeWorkers, 20): the size of the worker pool.
func WithConsumeWorkers(n int) GroupOption { return pushOption(func(p *pushConfig) { p.workers = n }) }

// WithConsumeTimeout sets how long a concurrent handler call may take: its
// ctx is cancelled then, and its messages are sent back with delay level 3
// (RocketMQ's consumeTimeout, 15 min; it does not apply to orderly
// handlers, as in RocketMQ).
func WithConsumeTimeout(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.consumeTimeout = d })
}

// WithSuspendTime sets how long an orderly queue waits after its handler
// failed before the batch is delivered again (DefaultSuspendTime, 1 s).
func WithSuspendTime(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.suspendTime = d })
}

// WithPersistInterval sets how often a PushConsumer stores its offsets
// (DefaultPersistInterval, 5 s); they are also stored when a queue is
// revoked and at shutdown.
func WithPersistInterval(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.persistInterval = d })
}

// WithOffsetFile sets the file a broadcasting PushConsumer keeps its
// offsets in. The default is <user cache dir>/runnel/offsets/<client id>/
// <group>/offsets.json; the client id includes the instance name, which
// differs per process unless WithInstanceName fixes it, so a consumer that
// must resume where it stopped needs a fixed instance name or this option.
func WithOffsetFile(path string) GroupOption {
	return pushOption(func(p *pushConfig) { p.offsetFile = path })
}

// WithRevokeWait bounds how long a revoked queue waits for the handler
// calls already given its messages before its offset is committed and the
// queue let go (DefaultRevokeWait, 1 s; orderly queues wait up to the
// consume timeout, since another member must not consume a queue whose
// handler still runs). Messages finished later are consumed again by the
// next owner.
func WithRevokeWait(d time.Duration) GroupOption {
	return pushOption(func(p *pushConfig) { p.revokeWait = d })
}

// PushConsumer is RocketMQ's push consumer on a GroupConsumer: it pulls
// every queue assigned to this member with long polling (one loop per
// queue, with per-queue flow control), hands the messages to a handler
// and keeps the group's offsets, so that the group consumes every message
// at least once.
//
// A ConcurrentHandler runs on a bounded pool of workers, in batches; a
// failed message is sent back to the broker (CONSUMER_SEND_MSG_BACK, which
// redelivers it through %RETRY%<group> after a delay growing with its
// reconsume count, and dead-letters it after WithMaxReconsumeTimes (16));
// a message whose send-back fails is delivered again locally 5 s later.
// The committed offset of a queue is the smallest offset still in process,
// stored on the broker every WithPersistInterval and when the queue is
// revoked (clustering) or in a local file (WithBroadcasting,
// WithOffsetFile). An OrderlyHandler consumes each queue in order under
// its broker lock (the GroupConsumer's locking mode), suspending the queue
// on failure.
//
// Delivery is at least once: after a crash, or for messages whose handler
// call outlived WithRevokeWait when their queue moved, the next owner
// consumes them again.
//
// Subscribe, Start, Shutdown and Close are safe for concurrent use;
// handlers run on the consumer's goroutines, which Shutdown and Close join.
type PushConsumer struct {
	c       *Client
	group   string
	cfg     groupConfig
	mode    pushMode
	conc    ConcurrentHandler
	orderly OrderlyHandler
	gc      *GroupConsumer
	log     *slog.Logger
	offsets offsetStore
	hooks   *clientHooks

	maxReconsume int32

	// runCtx ends when the consumer stops pulling; handlerCtx when
	// handler calls must end (a Shutdown whose ctx ended, Close).
	runCtx       context.Context
	stopRun      context.CancelFunc
	handlerCtx   context.Context
	stopHandlers context.CancelFunc
	workersQuit  chan struct{} // closed to stop the workers
	work         chan consumeBatch
	ready        readyQueues // orderly: queues with messages to consume
	later        delayQueue
	wg           sync.WaitGroup // every goroutine of the consumer
	outstanding  atomic.Int64   // batches handed out and not finished
	workers      []*pushWorker
	shutdownOnce sync.Once
	shutdownErr  error
	life         sync.Mutex // serialises Start and Shutdown

	mu struct {
		sync.Mutex
		state  int
		queues map[protocol.MessageQueue]*pushQueue
	}
}

// NewPushConsumer returns a PushConsumer of group on c calling h (a
// ConcurrentHandler or an OrderlyHandler). It takes the GroupConsumer's
// options (allocation, rebalance interval, WithBroadcasting, lock
// intervals, WithListener, WithMaxReconsumeTimes) and the PushConsumer's
// (WithConsumeFrom, WithConsumeWorkers, …). An OrderlyHandler in
// clustering mode turns on queue locking. Nothing is sent until Start;
// the PushConsumer does not own c: close it before c.
func NewPushConsumer(c *Client, group string, h Handler, opts ...GroupOption) (*PushConsumer, error) {
	if c == nil {
		return nil, errors.New("client: nil Client")
	}
	pc := &PushConsumer{c: c, group: group, hooks: &c.cfg.hooks}
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
	cfg := groupConfig{
		allocator:         AllocateAveragely(),
		rebalanceInterval: DefaultRebalanceInterval,
		lockRenew:         DefaultLockRenewInterval,
		lockValidity:      DefaultLockValidity,
		timeout:           DefaultGroupTimeout,
		maxReconsume:      -1,
		push:              defaultPushConfig(),
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.push.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	pc.maxReconsume = cfg.maxReconsume
	if pc.maxReconsume < 0 {
		pc.maxReconsume = DefaultMaxReconsumeTimes
		if pc.mode == modeOrderly {
			pc.maxReconsume = math.MaxInt32
		}
	}
	user := cfg.listener
	gopts := []GroupOption{groupOptionFunc(func(g *groupConfig) {
		*g = cfg
		g.maxReconsume = pc.maxReconsume
		g.listener = &pushListener{pc: pc, user: user}
		g.consumeType = protocol.ConsumePassively
		g.consumeFrom = cfg.push.from.where
		if pc.mode == modeOrderly && !cfg.broadcasting {
			g.locking = true
		}
	})}
	gc, err := NewGroupConsumer(c, group, gopts...)
	if err != nil {
		return nil, err
	}
	pc.gc, pc.cfg, pc.log = gc, gc.cfg, gc.log.With("consumer", "push")
	pc.mu.queues = make(map[protocol.MessageQueue]*pushQueue)
	return pc, nil
}

// Group returns the consumer group name.
func (pc *PushConsumer) Group() string { return pc.group }

// GroupConsumer returns the group membership the consumer runs on (for
// Assignment and Rebalance).
func (pc *PushConsumer) GroupConsumer() *GroupConsumer { return pc.gc }

// Subscribe adds (or replaces) the subscription of topic. It must be
// called before Start.
func (pc *PushConsumer) Subscribe(topic string, sel Selector) error {
	pc.mu.Lock()
	st := pc.mu.state
	pc.mu.Unlock()
	switch st {
	case groupStarted:
		return ErrPushStarted
	case groupClosed:
		return ErrPushClosed
	}
	return pc.gc.SubscribeSelector(topic, sel)
}

// Start joins the group and starts consuming: it subscribes the group's
// retry topic (clustering), loads the offset file (broadcasting), starts
// the workers and the offset persistence, and starts the GroupConsumer
// (see GroupConsumer.Start: it waits for the first assignment, bounded by
// ctx). On an error nothing keeps running and Start may be retried.
func (pc *PushConsumer) Start(ctx context.Context) error {
	pc.life.Lock()
	defer pc.life.Unlock()
	pc.mu.Lock()
	switch pc.mu.state {
	case groupStarted:
		pc.mu.Unlock()
		return ErrPushStarted
	case groupClosed:
		pc.mu.Unlock()
		return ErrPushClosed
	}
	pc.mu.Unlock()
	if !pc.cfg.broadcasting {
		if _, ok := pc.gc.Selector(RetryTopic(pc.group)); !ok {
			if err := pc.gc.SubscribeSelector(RetryTopic(pc.group), ByTag(protocol.TagExpressionAll)); err != nil {
				return err
			}
		}
		pc.offsets = &remoteOffsets{c: pc.c, group: pc.group}
	} else {
		path := pc.cfg.push.offsetFile
		if path == "" {
			dir, err := os.UserCacheDir()
			if err != nil {
				return fmt.Errorf("client: broadcasting offsets: %w (set WithOffsetFile)", err)
			}
			path = filepath.Join(dir, "runnel", "offsets", pc.c.ClientID(), pc.group, "offsets.json")
		}
		fo, err := openFileOffsets(path)
		if err != nil {
			return err
		}
		pc.offsets = fo
	}
	pc.runCtx, pc.stopRun = context.WithCancel(context.Background())
	pc.handlerCtx, pc.stopHandlers = context.WithCancel(context.Background())
	pc.workersQuit = make(chan struct{})
	pc.ready.init()
	pc.later.init()
	pc.workers = make([]*pushWorker, pc.cfg.push.workers)
	for i := range pc.workers {
		w := &pushWorker{pc: pc}
		w.ctx, w.cancel = context.WithCancel(pc.handlerCtx)
		pc.workers[i] = w
	}
	ok := pc.goStart("push-later", pc.later.run)
	ok = ok && pc.goStart("push-persist", pc.persistLoop)
	if pc.mode == modeConcurrent {
		pc.work = make(chan consumeBatch, pc.cfg.push.workers)
		ok = ok && pc.goStart("push-timeouts", pc.timeoutLoop)
	}
	for _, w := range pc.workers {
		ok = ok && pc.goStart("push-worker", w.run)
	}
	if !ok {
		pc.stopAll()
		return ErrClosed
	}
	pc.mu.Lock()
	pc.mu.state = groupStarted
	pc.mu.Unlock()
	if err := pc.gc.Start(ctx); err != nil {
		pc.mu.Lock()
		pc.mu.state = groupNew
		pc.mu.Unlock()
		pc.stopAll()
		pc.workers = nil
		return err
	}
	return nil
}

// stopAll stops every goroutine of the consumer and waits for them.
func (pc *PushConsumer) stopAll() {
	pc.stopRun()
	pc.stopHandlers()
	select {
	case <-pc.workersQuit:
	default:
		close(pc.workersQuit)
	}
	pc.ready.close()
	pc.later.close()
	pc.wg.Wait()
}

// goStart runs fn on a goroutine owned by the Client (Close cancels ctx
// and joins it) and by pc (Shutdown joins it).
func (pc *PushConsumer) goStart(name string, fn func(ctx context.Context)) bool {
	pc.wg.Add(1)
	ok := pc.c.goStart(name+"-"+pc.group, func(ctx context.Context) {
		defer pc.wg.Done()
		fn(ctx)
	})
	if !ok {
		pc.wg.Done()
	}
	return ok
}

// Shutdown stops the consumer gracefully: it stops pulling, waits until
// the handler calls in progress and the batches already handed out are
// finished or ctx ends (then their ctx is cancelled, they are waited for,
// and their results are discarded: their messages stay unconsumed and are
// delivered again, to the next owner), stores the offsets (the smallest
// still in process), leaves the group (unlocking orderly queues) and joins
// every goroutine. Later calls return the first call's result.
func (pc *PushConsumer) Shutdown(ctx context.Context) error {
	pc.shutdownOnce.Do(func() { pc.shutdownErr = pc.shutdown(ctx) })
	return pc.shutdownErr
}

// Close is Shutdown without waiting for handler calls: their ctx is
// cancelled at once.
func (pc *PushConsumer) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return pc.Shutdown(ctx)
}

func (pc *PushConsumer) shutdown(ctx context.Context) error {
	pc.life.Lock()
	defer pc.life.Unlock()
	pc.mu.Lock()
	started := pc.mu.state == groupStarted
	pc.mu.state = groupClosed
	pc.mu.Unlock()
	if !started {
		return pc.gc.Close()
	}
	pc.stopRun() // pull loops end; nothing new is handed out
	for _, pq := range pc.queueList() {
		pq.stopPull()
	}
	if !pc.waitOutstanding(ctx, nil) {
		// Handed back: results of calls still running are discarded.
		for _, pq := range pc.queueList() {
			pq.dropped.Store(true)
		}
		pc.stopHandlers()
		pc.log.Warn("client: push consumer stopped before its handlers finished; their messages will be delivered again")
	}
	pc.stopHandlers()
	close(pc.workersQuit)
	pc.ready.close()
	pc.later.close()
	pc.wg.Wait()
	// Offsets: the group's final revocation (OnRevoke) persists each
	// queue's; persist all first in case a revocation cannot.
	pctx, cancel := context.WithTimeout(context.Background(), 2*pc.cfg.timeout)
	err := pc.persistAll(pctx)
	cancel()
	return errors.Join(err, pc.gc.Close())
}

// waitOutstanding waits until no batch (of pq, or of any queue when pq is
// nil) is handed out and unfinished, or until ctx ends (false).
func (pc *PushConsumer) waitOutstanding(ctx context.Context, pq *pushQueue) bool {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if pq == nil && pc.outstanding.Load() == 0 || pq != nil && pq.outstanding.Load() == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

func (pc *PushConsumer) queueList() []*pushQueue {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return slices.Collect(maps.Values(pc.mu.queues))
}

// persistAll stores the offsets of every queue the consumer has (those a
// shutdown dropped included: their offsets only count what was consumed
// before).
func (pc *PushConsumer) persistAll(ctx context.Context) error {
	var qs []protocol.MessageQueue
	for _, pq := range pc.queueList() {
		qs = append(qs, pq.mq)
	}
	slices.SortFunc(qs, protocol.MessageQueue.Compare)
	return pc.offsets.persist(ctx, qs)
}

func (pc *PushConsumer) persistLoop(ctx context.Context) {
	t := time.NewTicker(pc.cfg.push.persistInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-pc.runCtx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, 2*pc.cfg.timeout)
			if err := pc.persistAll(pctx); err != nil && ctx.Err() == nil {
				pc.log.Warn("client: persisting consume offsets failed", "err", err)
			}
			cancel()
		}
	}
}

// ---- rebalance ----

// pushListener is the GroupConsumer's listener: it starts and stops the
// queues' pull loops, then tells the user's listener.
type pushListener struct {
	pc   *PushConsumer
	user RebalanceListener
}

func (l *pushListener) OnAssign(ctx context.Context, qs []protocol.MessageQueue) {
	pc := l.pc
	for _, q := range qs {
		pc.mu.Lock()
		if pc.mu.state != groupStarted {
			pc.mu.Unlock()
			break
		}
		if _, ok := pc.mu.queues[q]; ok {
			pc.mu.Unlock()
			continue
		}
		pq := newPushQueue(pc, q)
		pc.mu.queues[q] = pq
		pc.mu.Unlock()
		if !pc.goStart("push-pull", pq.pullLoop) {
			close(pq.pullDone)
		}
	}
	if l.user != nil {
		l.user.OnAssign(ctx, qs)
	}
}

func (l *pushListener) OnRevoke(ctx context.Context, qs []protocol.MessageQueue) {
	pc := l.pc
	for _, q := range qs {
		pc.mu.Lock()
		pq := pc.mu.queues[q]
		pc.mu.Unlock()
		if pq == nil {
			continue
		}
		pq.stopPull()
		wait := pc.cfg.push.revokeWait
		if pc.mode == modeOrderly {
			wait = pc.cfg.push.consumeTimeout
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		if !pc.waitOutstanding(wctx, pq) {
			pc.log.Warn("client: queue revoked while its messages are still consumed; they will be consumed again", "queue", q)
		}
		cancel()
		pq.dropped.Store(true)
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pc.cfg.timeout)
		if err := pc.offsets.persist(pctx, []protocol.MessageQueue{q}); err != nil {
			pc.log.Warn("client: storing the offset of a revoked queue failed", "queue", q, "err", err)
		}
		cancel()
		pc.offsets.remove(q)
		pc.mu.Lock()
		delete(pc.mu.queues, q)
		pc.mu.Unlock()
	}
	if l.user != nil {
		l.user.OnRevoke(ctx, qs)
	}
}

// OnLockLost stops the queues at once (another member may hold their
// locks): no offset is stored, results still to come are discarded.
func (l *pushListener) OnLockLost(ctx context.Context, qs []protocol.MessageQueue) {
	pc := l.pc
	for _, q := range qs {
		pc.mu.Lock()
		pq := pc.mu.queues[q]
		delete(pc.mu.queues, q)
		pc.mu.Unlock()
		if pq == nil {
			continue
		}
		pq.dropped.Store(true)
		pq.stopPull()
		pc.offsets.remove(q)
	}
	if ll, ok := l.user.(LockLossListener); ok {
		ll.OnLockLost(ctx, qs)
	}
}

// ---- shared helpers ----

// resetRetryTopic shows a message that came back through the group's
// retry topic under its original topic (Java resetRetryAndNamespace).
func (pc *PushConsumer) resetRetryTopic(m *ConsumedMessage) {
	if isRetryTopic(m.Topic) && m.Topic == RetryTopic(pc.group) {
		if rt, ok := m.Property(protocol.PropRetryTopic); ok && rt != "" {
			m.Topic = rt
		}
	}
}

// prepare readies a batch for its handler: topics reset, results cleared,
// per-message contexts from the consume hooks.
func (pc *PushConsumer) prepare(ctx context.Context, msgs []*ConsumedMessage) {
	for _, m := range msgs {
		pc.resetRetryTopic(m)
		m.Result, m.DelayLevel, m.ctx = ConsumeSuccess, 0, ctx
		for _, h := range pc.hooks.consume {
			m.ctx = h.OnConsume(m.ctx, pc.group, &m.MessageExt)
		}
	}
}

// finished tells the consumed hooks about a batch.
func (pc *PushConsumer) finished(msgs []*ConsumedMessage, err error, took time.Duration) {
	if len(pc.hooks.consumed) == 0 {
		return
	}
	for _, m := range msgs {
		r := m.Result
		if err != nil {
			r = ConsumeRetryLater
		}
		for _, h := range pc.hooks.consumed {
			h.OnConsumed(m.Context(), pc.group, &m.MessageExt, r, took)
		}
	}
}

// call runs a handler, turning a panic into an error.
func (pc *PushConsumer) call(ctx context.Context, msgs []*ConsumedMessage) (err error) {
	defer func() {
		if r := recover(); r != nil {
			pc.log.Error("client: push consumer handler panicked; its messages are retried", "panic", r,
				"stack", string(debug.Stack()))
			err = fmt.Errorf("client: handler panicked: %v", r)
		}
	}()
	if pc.mode == modeOrderly {
		return pc.orderly(ctx, msgs)
	}
	return pc.conc(ctx, msgs)
}
