package client

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// The consume services of a PushConsumer: a pool of WithConsumeWorkers
// goroutines. Concurrent: the workers take batches from a bounded channel
// (the pull loops block when it is full). Orderly: the workers take queues
// from a ready list, one queue per worker at a time, and consume each
// queue's messages in order (Java's ConsumeMessageOrderlyService holds a
// per-queue lock for the same purpose).

// consumeBatch is one handler call's messages, all of one queue.
type consumeBatch struct {
	pq   *pushQueue
	msgs []*ConsumedMessage
}

// pushWorker is one goroutine of the pool. Its handler ctx is cancelled
// when its call times out (and made anew for the next call).
type pushWorker struct {
	pc *PushConsumer

	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	cur     consumeBatch // the call in progress (concurrent)
	start   time.Time
	expired bool // the timeout loop took cur over
}

func (w *pushWorker) run(cctx context.Context) {
	pc := w.pc
	stop := context.AfterFunc(cctx, pc.stopHandlers) // Client.Close ends handler calls too
	defer stop()
	defer w.cancelCtx()
	if pc.mode == modeOrderly {
		stop := context.AfterFunc(cctx, pc.ready.close)
		defer stop()
		for {
			pq := pc.ready.pop()
			if pq == nil {
				return
			}
			w.consumeOrderly(pq)
		}
	}
	for {
		select {
		case <-pc.workersQuit:
			return
		case <-cctx.Done():
			return
		case b := <-pc.work:
			w.consume(b)
		}
	}
}

func (w *pushWorker) cancelCtx() {
	w.mu.Lock()
	w.cancel()
	w.mu.Unlock()
}

// handlerCtx returns the worker's ctx for the next call, a fresh one when
// the last call's timed out.
func (w *pushWorker) handlerCtx() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() != nil && w.pc.handlerCtx.Err() == nil {
		w.ctx, w.cancel = context.WithCancel(w.pc.handlerCtx)
	}
	return w.ctx
}

// consume runs one concurrent batch.
func (w *pushWorker) consume(b consumeBatch) {
	pc, pq := w.pc, b.pq
	if pq.dropped.Load() {
		pq.finish()
		return
	}
	ctx := w.handlerCtx()
	pc.prepare(ctx, b.msgs)
	start := time.Now()
	w.mu.Lock()
	w.cur, w.start, w.expired = b, start, false
	w.mu.Unlock()
	err := pc.call(ctx, b.msgs)
	w.mu.Lock()
	expired := w.expired
	w.cur = consumeBatch{}
	w.mu.Unlock()
	if expired {
		return // sent back and finished by the timeout loop
	}
	pc.finished(b.msgs, err, time.Since(start))
	if pq.dropped.Load() {
		pq.finish() // not ours any more: the next owner consumes them again
		return
	}
	pc.processConcurrent(pq, b.msgs, err)
}

// processConcurrent applies a concurrent batch's results (Java
// ConsumeMessageConcurrentlyService.processConsumeResult): failed messages
// are sent back (clustering; dropped with a warning when broadcasting),
// those whose send-back failed stay in the queue and are consumed again
// after localRetryDelay with their reconsume count up; the others leave
// the queue and its offset moves to the smallest still in process.
func (pc *PushConsumer) processConcurrent(pq *pushQueue, msgs []*ConsumedMessage, err error) {
	var failed []*ConsumedMessage
	for _, m := range msgs {
		if err == nil && m.Result != ConsumeRetryLater {
			continue
		}
		if pc.cfg.broadcasting {
			pc.log.Warn("client: broadcasting consumption failed; the message is dropped", "queue", m.Queue,
				"offset", m.QueueOffset, "msgId", m.MsgID())
			continue
		}
		if serr := pc.c.sendBack(context.Background(), pc.group, &m.MessageExt, m.Queue, m.DelayLevel, pc.maxReconsume); serr != nil {
			pc.log.Warn("client: send-back failed; consuming the message again locally", "queue", m.Queue,
				"offset", m.QueueOffset, "err", serr)
			m.ReconsumeTimes++
			failed = append(failed, m)
		}
	}
	done := msgs
	if failed != nil {
		done = make([]*ConsumedMessage, 0, len(msgs)-len(failed))
		for _, m := range msgs {
			if !slices.Contains(failed, m) {
				done = append(done, m)
			}
		}
	}
	if off := pq.remove(done); off >= 0 && !pq.dropped.Load() {
		pc.offsets.update(pq.mq, off, true)
	}
	pq.finish()
	if len(failed) > 0 {
		pc.later.after(pc.cfg.push.localRetry, func() {
			if !pq.dropped.Load() && pq.ctx.Err() == nil {
				pq.handOut(failed)
			}
		})
	}
}

// timeoutLoop sends back the messages of concurrent calls that outlived
// the consume timeout (Java cleanExpireMsg, with delay level 3) and
// cancels their ctx; their eventual results are discarded.
func (pc *PushConsumer) timeoutLoop(ctx context.Context) {
	every := max(min(pc.cfg.push.consumeTimeout/4, time.Minute), time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-pc.workersQuit:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, w := range pc.workers {
			w.mu.Lock()
			b := w.cur
			if b.pq == nil || w.expired || now.Sub(w.start) <= pc.cfg.push.consumeTimeout {
				w.mu.Unlock()
				continue
			}
			w.expired = true
			w.cancel()
			w.mu.Unlock()
			pc.expire(b)
		}
	}
}

func (pc *PushConsumer) expire(b consumeBatch) {
	pq := b.pq
	defer pq.finish()
	if pq.dropped.Load() {
		return
	}
	pc.log.Warn("client: handler call exceeded the consume timeout; its messages are sent back", "queue", pq.mq,
		"messages", len(b.msgs), "timeout", pc.cfg.push.consumeTimeout)
	for _, m := range b.msgs {
		if pc.cfg.broadcasting {
			continue
		}
		if err := pc.c.sendBack(context.Background(), pc.group, &m.MessageExt, m.Queue, 3, pc.maxReconsume); err != nil {
			pc.log.Warn("client: send-back of a timed-out message failed", "queue", pq.mq, "offset", m.QueueOffset, "err", err)
			continue
		}
		if off := pq.remove([]*ConsumedMessage{m}); off >= 0 && !pq.dropped.Load() {
			pc.offsets.update(pq.mq, off, true)
		}
	}
}

// consumeOrderly consumes one queue's messages in order until none is
// left, the queue is suspended or stopped, or the worker has run it for
// maxOrderlyRun (then it goes to the back of the ready list).
func (w *pushWorker) consumeOrderly(pq *pushQueue) {
	pc := w.pc
	begin := time.Now()
	for {
		if pq.dropped.Load() || pq.ctx.Err() != nil || !pc.ownsQueue(pq.mq) {
			pq.unschedule()
			return
		}
		if time.Since(begin) > maxOrderlyRun {
			pc.later.after(orderlyYieldDelay, func() { pc.ready.push(pq) })
			return
		}
		msgs := pq.take(pc.cfg.push.batchMax)
		if len(msgs) == 0 {
			if pq.unscheduleIfIdle() {
				return
			}
			continue
		}
		ctx := w.handlerCtx()
		pc.prepare(ctx, msgs)
		start := time.Now()
		err := pc.call(ctx, msgs)
		pc.finished(msgs, err, time.Since(start))
		if pq.dropped.Load() {
			pq.finish()
			pq.unschedule()
			return
		}
		if err == nil || !pc.reconsumeOrderly(msgs) {
			off := pq.commitTaken()
			pc.offsets.update(pq.mq, off, false)
			pq.finish()
			continue
		}
		pq.untake()
		pq.finish()
		pc.later.after(pc.cfg.push.suspendTime, func() { pc.ready.push(pq) }) // still scheduled
		return
	}
}

// reconsumeOrderly counts a failed orderly batch (Java
// checkReconsumeTimes): messages that failed WithMaxReconsumeTimes times
// are sent to the retry topic with their count (the broker dead-letters
// them: the count is over the limit, and the group holds locks); it
// reports whether the queue must be suspended and the batch consumed
// again (some message is under its limit, or could not be sent).
func (pc *PushConsumer) reconsumeOrderly(msgs []*ConsumedMessage) bool {
	suspend := false
	for _, m := range msgs {
		if m.ReconsumeTimes >= pc.maxReconsume {
			if err := pc.c.sendToRetry(context.Background(), pc.group, &m.MessageExt, pc.maxReconsume, 3+int(m.ReconsumeTimes)); err == nil {
				continue
			} else {
				pc.log.Warn("client: orderly send-back failed; the queue stays suspended", "queue", m.Queue, "offset", m.QueueOffset, "err", err)
			}
		}
		suspend = true
		m.ReconsumeTimes++
	}
	return suspend
}

// ownsQueue reports whether the group still owns q (in locking mode: with a
// lock still valid).
func (pc *PushConsumer) ownsQueue(q protocol.MessageQueue) bool { return pc.gc.owns(q) }

// ---- ready list (orderly) ----

// readyQueues is the FIFO of queues with messages to consume. A queue is
// in it at most once (pushQueue.mu.scheduled), so it holds at most the
// assigned queues.
type readyQueues struct {
	mu     sync.Mutex
	cond   *sync.Cond
	list   []*pushQueue
	closed bool
}

func (r *readyQueues) init() {
	r.cond = sync.NewCond(&r.mu)
	r.list, r.closed = nil, false
}

func (r *readyQueues) push(pq *pushQueue) {
	r.mu.Lock()
	if !r.closed {
		r.list = append(r.list, pq)
		r.cond.Signal()
	}
	r.mu.Unlock()
}

// pop waits for a queue; nil once closed.
func (r *readyQueues) pop() *pushQueue {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.list) == 0 && !r.closed {
		r.cond.Wait()
	}
	if r.closed {
		return nil
	}
	pq := r.list[0]
	r.list[0] = nil
	r.list = r.list[1:]
	return pq
}

func (r *readyQueues) close() {
	if r.cond == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	r.list = nil
	r.cond.Broadcast()
	r.mu.Unlock()
}

// ---- delayed work ----

// delayQueue runs functions after a delay on one goroutine (run). Pending
// functions are dropped by close.
type delayQueue struct {
	mu     sync.Mutex
	items  delayHeap
	closed bool
	wake   chan struct{}
	quit   chan struct{}
}

type delayItem struct {
	due time.Time
	fn  func()
}

type delayHeap []delayItem

func (h delayHeap) Len() int           { return len(h) }
func (h delayHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h delayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)        { *h = append(*h, x.(delayItem)) }
func (h *delayHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = delayItem{}
	*h = old[:len(old)-1]
	return it
}

func (d *delayQueue) init() {
	d.items, d.closed = nil, false
	d.wake, d.quit = make(chan struct{}, 1), make(chan struct{})
}

func (d *delayQueue) after(dur time.Duration, fn func()) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	heap.Push(&d.items, delayItem{due: time.Now().Add(dur), fn: fn})
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *delayQueue) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed && d.quit != nil {
		d.closed = true
		d.items = nil
		close(d.quit)
	}
}

func (d *delayQueue) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.mu.Lock()
		var due []func()
		now := time.Now()
		for len(d.items) > 0 && !d.items[0].due.After(now) {
			due = append(due, heap.Pop(&d.items).(delayItem).fn)
		}
		next := time.Hour
		if len(d.items) > 0 {
			next = d.items[0].due.Sub(now)
		}
		d.mu.Unlock()
		for _, fn := range due {
			fn()
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-d.quit:
			return
		case <-d.wake:
		case <-t.C:
		}
	}
}
