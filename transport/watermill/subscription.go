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

// Subscribe joins topic's consumer group and returns the channel its
// messages arrive on (unbuffered). The topic is created as by
// SubscribeInitialize when no name server knows it (unless
// DoNotCreateTopics). It blocks until the first rebalance assigned this
// member its queues, bounded by ctx and InitializeTimeout.
//
// The channel is closed when ctx is done or the Subscriber closes, after
// the group was left: every queue's loop stopped and its acked offset was
// committed. Messages carry a Context derived from ctx (values kept), which
// is cancelled once the message is acked or nacked, or when its queue stops.
//
// A Client is one member of a group, so a Subscriber refuses a second active
// subscription in the same group (ErrGroupActive): use another Subscriber
// (another member) or another group.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	group := s.group(topic)
	s.mu.Lock()
	switch {
	case s.mu.closed:
		s.mu.Unlock()
		return nil, ErrSubscriberClosed
	case s.mu.groups[group]:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: group %s (topic %s)", ErrGroupActive, group, topic)
	}
	s.mu.groups[group] = true
	s.wg.Add(1) // the teardown goroutine, or undone below
	s.mu.Unlock()

	sub, err := s.join(ctx, topic, group)
	if err != nil {
		s.releaseGroup(group)
		s.wg.Done()
		return nil, err
	}
	go sub.teardown(ctx)
	return sub.out, nil
}

func (s *Subscriber) releaseGroup(group string) {
	s.mu.Lock()
	delete(s.mu.groups, group)
	s.mu.Unlock()
}

// join starts the group consumer of one subscription.
func (s *Subscriber) join(ctx context.Context, topic, group string) (*subscription, error) {
	jctx, cancel := s.opCtx(ctx, s.cfg.InitializeTimeout)
	defer cancel()
	if _, err := s.c.Route(jctx, topic); err != nil {
		if !errors.Is(err, protocol.ErrTopicNotExist) || s.cfg.DoNotCreateTopics {
			return nil, fmt.Errorf("watermill: subscribe %s: %w", topic, err)
		}
		if err := s.initialize(jctx, topic); err != nil {
			return nil, fmt.Errorf("watermill: subscribe %s: %w", topic, err)
		}
	}
	sub := &subscription{s: s, topic: topic, group: group, out: make(chan *message.Message),
		logger: s.logger.With(watermill.LogFields{"topic": topic, "consumer_group": group})}
	sub.mu.workers = map[protocol.MessageQueue]*queueWorker{}
	// The subscription's ctx keeps ctx's values but only ends by teardown.
	sub.ctx, sub.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if s.cfg.SendBackAfterAttempts > 0 {
		if _, err := s.c.Route(jctx, retryTopic(group)); err != nil {
			if err := s.createTopic(jctx, retryTopic(group), 1); err != nil {
				sub.cancel()
				return nil, fmt.Errorf("watermill: subscribe %s: %w", topic, err)
			}
		}
	}
	opts := append(append([]client.GroupOption(nil), s.cfg.GroupOptions...), client.WithListener(sub))
	gc, err := client.NewGroupConsumer(s.c, group, opts...)
	if err == nil {
		err = gc.Subscribe(topic, "*")
	}
	if err == nil && s.cfg.SendBackAfterAttempts > 0 {
		err = gc.Subscribe(retryTopic(group), "*")
	}
	if err != nil {
		sub.cancel()
		return nil, fmt.Errorf("watermill: subscribe %s: %w", topic, err)
	}
	sub.gc = gc
	if err := gc.Start(jctx); err != nil {
		_ = gc.Close()
		sub.cancel()
		sub.wg.Wait()
		return nil, fmt.Errorf("watermill: subscribe %s: join group %s: %w", topic, group, err)
	}
	return sub, nil
}

// subscription is one Subscribe call: a group membership and the queue
// loops of its assignment.
type subscription struct {
	s      *Subscriber
	topic  string
	group  string
	out    chan *message.Message
	logger watermill.LoggerAdapter
	gc     *client.GroupConsumer

	ctx    context.Context // values of the Subscribe ctx; cancelled by teardown
	cancel context.CancelFunc
	wg     sync.WaitGroup // queue loops
	mu     struct {
		sync.Mutex
		workers map[protocol.MessageQueue]*queueWorker
	}
}

// teardown waits for the end of the subscription, leaves the group (which
// revokes, stops and commits every queue), then closes the channel.
func (sub *subscription) teardown(ctx context.Context) {
	defer sub.s.wg.Done()
	select {
	case <-ctx.Done():
	case <-sub.s.life.Done():
	}
	if err := sub.gc.Close(); err != nil {
		sub.logger.Error("leaving the consumer group failed", err, nil)
	}
	sub.cancel()
	sub.stop(sub.allQueues()) // queues whose revocation did not run
	sub.wg.Wait()
	// The group is free before the channel closes: a caller that sees it
	// closed may subscribe in the group again at once.
	sub.s.releaseGroup(sub.group)
	close(sub.out)
	sub.logger.Debug("subscription closed", nil)
}

func (sub *subscription) allQueues() []protocol.MessageQueue {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	qs := make([]protocol.MessageQueue, 0, len(sub.mu.workers))
	for q := range sub.mu.workers {
		qs = append(qs, q)
	}
	return qs
}

// OnAssign implements client.RebalanceListener: it starts a loop per queue.
// It first tries to read each queue's start offset, so that when Subscribe
// returns the start positions are fixed (with OffsetLast: messages stored
// after Subscribe returned are received).
func (sub *subscription) OnAssign(ctx context.Context, queues []protocol.MessageQueue) {
	// Listener calls never overlap, and only they add workers, so the
	// queues not running now cannot start before the lock below; the
	// offsets are read without holding it.
	ws := make([]*queueWorker, 0, len(queues))
	for _, q := range queues {
		sub.mu.Lock()
		_, running := sub.mu.workers[q]
		sub.mu.Unlock()
		if running {
			continue
		}
		w := &queueWorker{sub: sub, q: q, done: make(chan struct{}), committed: -1, start: -1}
		if off, err := w.readStartOffset(ctx); err == nil {
			w.start = off
		}
		ws = append(ws, w)
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	for _, w := range ws {
		if sub.ctx.Err() != nil {
			return
		}
		wctx, cancel := context.WithCancel(sub.ctx)
		w.cancel = cancel
		sub.mu.workers[w.q] = w
		sub.wg.Add(1)
		go func() {
			defer sub.wg.Done()
			w.run(wctx)
		}()
		sub.logger.Debug("queue assigned", watermill.LogFields{"queue": w.q.String()})
	}
}

// OnRevoke implements client.RebalanceListener: it stops the queues'
// loops and returns once each committed its acked offset, so that the next
// owner starts after everything acked here.
func (sub *subscription) OnRevoke(_ context.Context, queues []protocol.MessageQueue) {
	sub.stop(queues)
}

func (sub *subscription) stop(queues []protocol.MessageQueue) {
	sub.mu.Lock()
	ws := make([]*queueWorker, 0, len(queues))
	for _, q := range queues {
		if w, ok := sub.mu.workers[q]; ok {
			delete(sub.mu.workers, q)
			w.cancel()
			ws = append(ws, w)
		}
	}
	sub.mu.Unlock()
	for _, w := range ws {
		<-w.done
		sub.logger.Debug("queue revoked", watermill.LogFields{"queue": w.q.String()})
	}
}

// queueWorker reads one queue and delivers its messages one at a time. Its
// fields below done are owned by its goroutine.
type queueWorker struct {
	sub    *subscription
	q      protocol.MessageQueue
	cancel context.CancelFunc
	done   chan struct{} // closed when run returned (after the final commit)

	acked      int64 // low watermark: every offset below was acked or skipped
	committed  int64 // last offset committed to the broker (-1 = none)
	lastCommit time.Time
	start      int64            // start offset read in OnAssign; -1 = read it in run
	tick       <-chan time.Time // CommitInterval ticks while waiting for acks
}

func (w *queueWorker) cfg() *SubscriberConfig { return &w.sub.s.cfg }

func (w *queueWorker) run(ctx context.Context) {
	defer close(w.done)
	next := w.start
	if next < 0 {
		var ok bool
		if next, ok = w.startOffset(ctx); !ok {
			return
		}
	}
	w.acked = next
	defer w.commit(true)
	cfg := w.cfg()
	if cfg.CommitInterval > 0 {
		t := time.NewTicker(cfg.CommitInterval)
		defer t.Stop()
		w.tick = t.C
	}
	backoff := newBackoff(50*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil {
		req := client.PullRequest{Queue: w.q, Offset: next, MaxMsgs: int32(cfg.PullBatchSize),
			Suspend: cfg.PollTimeout, Group: w.sub.group}
		if w.acked > 0 && w.acked != w.committed {
			req.CommitOffset = w.acked
		}
		res, err := w.sub.s.c.Pull(ctx, req)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.sub.logger.Error("pull failed, retrying", err, watermill.LogFields{"queue": w.q.String(), "offset": next})
			if !sleepCtx(ctx, backoff.next()) {
				return
			}
			continue
		}
		backoff.reset()
		if req.CommitOffset > 0 {
			w.committed, w.lastCommit = req.CommitOffset, time.Now()
		}
		switch res.Status {
		case client.PullFound:
			for i := range res.Messages {
				if !w.deliver(ctx, &res.Messages[i]) {
					return
				}
			}
			next = res.NextBeginOffset
			w.acked = max(w.acked, next) // offsets the filter dropped
		case client.PullNoNewMsg, client.PullNoMatchedMsg:
			if res.NextBeginOffset > next {
				next = res.NextBeginOffset
				w.acked = max(w.acked, next)
			}
		case client.PullOffsetIllegal:
			w.sub.logger.Info("offset outside the queue, moving", watermill.LogFields{"queue": w.q.String(),
				"offset": next, "next": res.NextBeginOffset})
			next = res.NextBeginOffset
			w.acked = next
		}
	}
}

// startOffset returns the group's committed offset of the queue, or the
// InitialOffset when it has none. It retries until ctx ends (false).
func (w *queueWorker) startOffset(ctx context.Context) (int64, bool) {
	backoff := newBackoff(50*time.Millisecond, 2*time.Second)
	for {
		off, err := w.readStartOffset(ctx)
		if err == nil {
			return off, true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		w.sub.logger.Error("reading the start offset failed, retrying", err, watermill.LogFields{"queue": w.q.String()})
		if !sleepCtx(ctx, backoff.next()) {
			return 0, false
		}
	}
}

// readStartOffset makes one attempt of startOffset. It sets w.committed to
// the committed offset found (else it stays -1, and the start is committed
// when the loop ends).
func (w *queueWorker) readStartOffset(ctx context.Context) (int64, error) {
	c, cfg := w.sub.s.c, w.cfg()
	ctx, cancel := context.WithTimeout(ctx, cfg.OperationTimeout)
	defer cancel()
	off, err := c.QueryConsumerOffset(ctx, w.sub.group, w.q)
	switch {
	case err == nil && off >= 0:
		w.committed = off
		return off, nil
	case err != nil && !errors.Is(err, client.ErrNoOffset):
		return 0, err
	case cfg.InitialOffset == OffsetLast:
		return c.MaxOffset(ctx, w.q)
	default:
		return c.MinOffset(ctx, w.q)
	}
}

// deliver hands one message to the subscriber's channel and waits for its
// Ack; on Nack it delivers it again after a backoff (or sends it back). It
// returns false when ctx ended first (the message is then not acked).
func (w *queueWorker) deliver(ctx context.Context, ext *protocol.MessageExt) bool {
	cfg := w.cfg()
	off := ext.QueueOffset
	delay := cfg.NackResendDelay
	for attempt := 1; ; attempt++ {
		msg, err := cfg.Unmarshaler.Unmarshal(ext)
		if err != nil {
			w.sub.logger.Error("unmarshal failed, message skipped", err,
				watermill.LogFields{"queue": w.q.String(), "offset": off})
			w.acked = off + 1
			return true
		}
		info := &queueInfo{queue: w.q, offset: off, group: w.sub.group}
		mctx, cancel := context.WithCancel(context.WithValue(ctx, queueCtxKey{}, info))
		msg.SetContext(mctx)
		select {
		case w.sub.out <- msg:
		case <-ctx.Done():
			cancel()
			return false
		}
	wait:
		for {
			select {
			case <-msg.Acked():
				cancel()
				w.acked = off + 1
				return true
			case <-msg.Nacked():
				cancel()
				break wait
			case <-w.tick:
				w.commit(false)
			case <-ctx.Done():
				cancel()
				return false
			}
		}
		if n := cfg.SendBackAfterAttempts; n > 0 && attempt >= n {
			if err := w.sendBack(ctx, ext); err == nil {
				w.acked = off + 1
				return true
			} else if ctx.Err() != nil {
				return false
			} else {
				w.sub.logger.Error("send-back failed, redelivering in-process", err,
					watermill.LogFields{"queue": w.q.String(), "offset": off})
			}
		}
		if !sleepCtx(ctx, delay) {
			return false
		}
		delay = min(2*delay, cfg.NackResendMaxDelay)
	}
}

// sendBack hands the message back to the broker (CONSUMER_SEND_MSG_BACK,
// RocketMQ's retry path): the broker stores it again in the group's retry
// topic after SendBackDelayLevel, its reconsume count up, and moves it to
// the group's dead-letter topic %DLQ%<group> once it was consumed
// MaxReconsumeTimes times (client.WithMaxReconsumeTimes in GroupOptions;
// 16 by default). The client sends it to the retry topic itself only when
// the broker refuses the request. What goes back is the message as stored
// (the handler's changes to the watermill message are not kept), as with
// any RocketMQ consumer.
func (w *queueWorker) sendBack(ctx context.Context, ext *protocol.MessageExt) error {
	sctx, cancel := context.WithTimeout(ctx, w.cfg().OperationTimeout)
	defer cancel()
	if err := w.sub.gc.SendBack(sctx, ext, w.cfg().SendBackDelayLevel); err != nil {
		return fmt.Errorf("watermill: send back to %s: %w", retryTopic(w.sub.group), err)
	}
	return nil
}

// commit stores the acked offset on the broker when it moved (and, unless
// final, when CommitInterval passed since the last commit).
func (w *queueWorker) commit(final bool) {
	if w.acked == w.committed || (!final && time.Since(w.lastCommit) < w.cfg().CommitInterval) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg().OperationTimeout)
	defer cancel()
	if err := w.sub.s.c.CommitOffset(ctx, w.sub.group, w.q, w.acked); err != nil {
		w.sub.logger.Error("committing the offset failed", err, watermill.LogFields{"queue": w.q.String(), "offset": w.acked})
		return
	}
	w.committed, w.lastCommit = w.acked, time.Now()
}

// Close ends every subscription (leaving its group: queue loops stop and
// commit their acked offsets), waits for their goroutines, closes their
// channels and, when the Subscriber created it, the client. Messages in
// flight are not acked; their contexts are cancelled. Close is idempotent;
// later calls return the first call's result.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.mu.closed = true
		s.mu.Unlock()
		s.shutdown()
		s.wg.Wait()
		var err error
		if s.ownsC {
			err = s.c.Close()
		}
		s.closeErr = err
	})
	return s.closeErr
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff doubles a delay from min to max.
type backoff struct{ cur, lo, hi time.Duration }

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{cur: lo, lo: lo, hi: hi} }

func (b *backoff) next() time.Duration {
	d := b.cur
	b.cur = min(2*b.cur, b.hi)
	return d
}

func (b *backoff) reset() { b.cur = b.lo }
