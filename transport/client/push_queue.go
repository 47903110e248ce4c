package client

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// pushQueue is RocketMQ's ProcessQueue: the messages of one assigned queue
// that were pulled and are not consumed yet, in offset order, and the
// queue's pull loop. Its entries below head are consumed; the committed
// offset is the offset of the first entry not consumed (or one past the
// last pulled when every entry is).
type pushQueue struct {
	pc       *PushConsumer
	mq       protocol.MessageQueue
	ctx      context.Context // the pull loop's; cancelled by stopPull
	cancel   context.CancelFunc
	pullDone chan struct{}
	// dropped: the queue is no longer ours; results still to come are
	// discarded and no offset is stored for it.
	dropped     atomic.Bool
	outstanding atomic.Int64 // batches handed out and not finished

	mu struct {
		sync.Mutex
		entries   []pqEntry
		head      int   // entries[:head] are consumed
		count     int   // entries not consumed
		bytes     int64 // their body bytes
		maxOffset int64 // highest offset pulled, -1 before the first
		taken     int   // orderly: entries[head:head+taken] are being consumed
		scheduled bool  // orderly: in the ready list, being consumed, or suspended
		stopped   bool  // stopPull was called: take hands out nothing more
	}
}

type pqEntry struct {
	m    *ConsumedMessage
	done bool
}

func newPushQueue(pc *PushConsumer, q protocol.MessageQueue) *pushQueue {
	pq := &pushQueue{pc: pc, mq: q, pullDone: make(chan struct{})}
	pq.ctx, pq.cancel = context.WithCancel(pc.runCtx)
	pq.mu.maxOffset = -1
	return pq
}

// stopPull ends the pull loop and waits for it; take gives out no more
// batches after it (so that, once outstanding is 0, no handler call of
// the queue runs or starts).
func (pq *pushQueue) stopPull() {
	pq.mu.Lock()
	pq.mu.stopped = true
	pq.mu.Unlock()
	pq.cancel()
	<-pq.pullDone
}

// finish marks one handed-out batch finished.
func (pq *pushQueue) finish() {
	pq.outstanding.Add(-1)
	pq.pc.outstanding.Add(-1)
}

func (pq *pushQueue) start() {
	pq.outstanding.Add(1)
	pq.pc.outstanding.Add(1)
}

// add appends pulled messages (in offset order, after every entry).
func (pq *pushQueue) add(msgs []*ConsumedMessage) {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	for _, m := range msgs {
		if m.QueueOffset <= pq.mu.maxOffset {
			continue // already pulled (cannot happen: pulls move forward)
		}
		pq.mu.entries = append(pq.mu.entries, pqEntry{m: m})
		pq.mu.count++
		pq.mu.bytes += int64(len(m.Body))
		pq.mu.maxOffset = m.QueueOffset
	}
}

// overloaded reports whether the pull loop must wait (flow control).
func (pq *pushQueue) overloaded() bool {
	cfg := &pq.pc.cfg.push
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if pq.mu.count > cfg.queueMaxMsgs || pq.mu.bytes > cfg.queueMaxBytes {
		return true
	}
	if pq.pc.mode == modeConcurrent && pq.mu.count > 0 {
		first := pq.mu.entries[pq.mu.head].m.QueueOffset
		last := pq.mu.entries[len(pq.mu.entries)-1].m.QueueOffset
		return last-first > cfg.maxSpan
	}
	return false
}

// empty reports whether nothing pulled is waiting.
func (pq *pushQueue) empty() bool {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	return pq.mu.count == 0
}

// remove marks msgs consumed (concurrent) and returns the queue's offset
// to commit, -1 when nothing was in process (Java removeMessage).
func (pq *pushQueue) remove(msgs []*ConsumedMessage) int64 {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if pq.mu.count == 0 {
		return -1
	}
	live := pq.mu.entries[pq.mu.head:]
	for _, m := range msgs {
		i := sort.Search(len(live), func(i int) bool { return live[i].m.QueueOffset >= m.QueueOffset })
		if i < len(live) && live[i].m == m && !live[i].done {
			live[i].done = true
			pq.mu.count--
			pq.mu.bytes -= int64(len(m.Body))
		}
	}
	pq.advanceLocked()
	return pq.offsetLocked()
}

// advanceLocked moves head past consumed entries and compacts.
func (pq *pushQueue) advanceLocked() {
	e := pq.mu.entries
	for pq.mu.head < len(e) && e[pq.mu.head].done {
		e[pq.mu.head] = pqEntry{}
		pq.mu.head++
	}
	if pq.mu.head == len(e) {
		pq.mu.entries, pq.mu.head = e[:0], 0
	} else if pq.mu.head > 256 && pq.mu.head > len(e)/2 {
		n := copy(e, e[pq.mu.head:])
		clear(e[n:])
		pq.mu.entries, pq.mu.head = e[:n], 0
	}
}

func (pq *pushQueue) offsetLocked() int64 {
	if pq.mu.head < len(pq.mu.entries) {
		return pq.mu.entries[pq.mu.head].m.QueueOffset
	}
	return pq.mu.maxOffset + 1
}

// take returns up to n messages after those being consumed (orderly) and
// counts the batch outstanding; nothing once the queue stopped.
func (pq *pushQueue) take(n int) []*ConsumedMessage {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	from := pq.mu.head + pq.mu.taken
	to := min(from+n, len(pq.mu.entries))
	if from >= to || pq.mu.stopped {
		return nil
	}
	pq.start()
	out := make([]*ConsumedMessage, 0, to-from)
	for _, e := range pq.mu.entries[from:to] {
		out = append(out, e.m)
	}
	pq.mu.taken += to - from
	return out
}

// commitTaken marks the messages being consumed consumed and returns the
// offset after them (Java ProcessQueue.commit).
func (pq *pushQueue) commitTaken() int64 {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	e := pq.mu.entries
	last := int64(-1)
	for i := pq.mu.head; i < pq.mu.head+pq.mu.taken; i++ {
		e[i].done = true
		pq.mu.count--
		pq.mu.bytes -= int64(len(e[i].m.Body))
		last = e[i].m.QueueOffset
	}
	pq.mu.taken = 0
	pq.advanceLocked()
	return last + 1
}

// untake gives the messages being consumed back (orderly: consumed again).
func (pq *pushQueue) untake() {
	pq.mu.Lock()
	pq.mu.taken = 0
	pq.mu.Unlock()
}

// schedule puts the queue in the ready list unless it is there, being
// consumed or suspended (orderly).
func (pq *pushQueue) schedule() {
	pq.mu.Lock()
	if pq.mu.scheduled {
		pq.mu.Unlock()
		return
	}
	pq.mu.scheduled = true
	pq.mu.Unlock()
	pq.pc.ready.push(pq)
}

// unscheduleIfIdle ends a worker's turn when nothing waits (true);
// otherwise the worker goes on.
func (pq *pushQueue) unscheduleIfIdle() bool {
	pq.mu.Lock()
	defer pq.mu.Unlock()
	if pq.mu.head+pq.mu.taken < len(pq.mu.entries) && !pq.mu.stopped {
		return false
	}
	pq.mu.scheduled = false
	return true
}

func (pq *pushQueue) unschedule() {
	pq.mu.Lock()
	pq.mu.scheduled = false
	pq.mu.Unlock()
}

// ---- pull loop ----

// pullLoop pulls the queue until it stops (revoke, drop, shutdown) and
// hands the messages to the consume service.
func (pq *pushQueue) pullLoop(cctx context.Context) {
	defer close(pq.pullDone)
	stop := context.AfterFunc(cctx, pq.cancel)
	defer stop()
	pc, ctx := pq.pc, pq.ctx
	next, ok := pq.startOffset(ctx)
	if !ok {
		return
	}
	cfg := &pc.cfg.push
	sel, _ := pc.gc.Selector(pq.mq.Topic)
	for ctx.Err() == nil && !pq.dropped.Load() {
		if pq.overloaded() {
			if !sleepCtx(ctx, flowControlDelay) {
				return
			}
			continue
		}
		req := PullRequest{Queue: pq.mq, Offset: next, MaxMsgs: int32(cfg.pullBatch), Suspend: cfg.suspend,
			Group: pc.group, Expression: sel.Expression, ExpressionType: sel.Type}
		if !pc.cfg.broadcasting {
			if off, ok := pc.offsets.get(pq.mq); ok && off > 0 {
				req.CommitOffset = off
			}
		}
		res, err := pc.c.Pull(ctx, req)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			pc.log.Warn("client: pull failed; trying again", "queue", pq.mq, "offset", next, "err", err)
			if !sleepCtx(ctx, pullErrorDelay) {
				return
			}
			continue
		}
		switch res.Status {
		case PullFound:
			next = res.NextBeginOffset
			if len(res.Messages) > 0 {
				pq.dispatch(pq.wrap(res.Messages))
			}
		case PullNoNewMsg, PullNoMatchedMsg:
			next = res.NextBeginOffset
			if pq.empty() {
				pc.offsets.update(pq.mq, next, true) // Java correctTagsOffset
			}
		case PullOffsetIllegal:
			pc.log.Warn("client: pull offset outside the queue; moving", "queue", pq.mq, "offset", next, "next", res.NextBeginOffset)
			pq.moved(res.NextBeginOffset)
			return
		}
		if cfg.pullInterval > 0 && !sleepCtx(ctx, cfg.pullInterval) {
			return
		}
	}
}

// wrap makes the handler's messages of a pull (one allocation each for
// the messages and the pointers).
func (pq *pushQueue) wrap(ms []protocol.MessageExt) []*ConsumedMessage {
	cms := make([]ConsumedMessage, len(ms))
	ptrs := make([]*ConsumedMessage, len(ms))
	for i := range ms {
		cms[i] = ConsumedMessage{MessageExt: ms[i], Queue: pq.mq}
		ptrs[i] = &cms[i]
	}
	return ptrs
}

// dispatch adds pulled messages to the queue and hands them to the
// consume service: batches to the workers (concurrent), or the queue to
// the ready list (orderly). A batch that cannot be handed out before the
// queue stops stays in the queue, unconsumed.
func (pq *pushQueue) dispatch(msgs []*ConsumedMessage) {
	pq.add(msgs)
	pq.handOut(msgs)
}

func (pq *pushQueue) handOut(msgs []*ConsumedMessage) {
	pc := pq.pc
	if pc.mode == modeOrderly {
		pq.schedule()
		return
	}
	n := pc.cfg.push.batchMax
	for i := 0; i < len(msgs); i += n {
		b := consumeBatch{pq: pq, msgs: msgs[i:min(i+n, len(msgs))]}
		pq.start()
		select {
		case pc.work <- b:
		case <-pq.ctx.Done():
			pq.finish()
			return
		}
	}
}

// startOffset returns where the queue's consumption starts (Java
// computePullFromWhere): the stored offset, else by ConsumeFrom. It
// retries until it gets one or ctx ends (false).
func (pq *pushQueue) startOffset(ctx context.Context) (int64, bool) {
	pc := pq.pc
	delay := 100 * time.Millisecond
	for {
		off, err := pq.computeStart(ctx)
		if err == nil {
			return off, true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		pc.log.Warn("client: reading the start offset failed; trying again", "queue", pq.mq, "err", err)
		if !sleepCtx(ctx, delay) {
			return 0, false
		}
		delay = min(2*delay, pullErrorDelay)
	}
}

func (pq *pushQueue) computeStart(ctx context.Context) (int64, error) {
	pc, q := pq.pc, pq.mq
	rctx, cancel := context.WithTimeout(ctx, pc.cfg.timeout)
	defer cancel()
	off, ok, err := pc.offsets.read(rctx, q)
	if err != nil {
		return 0, err
	}
	if ok && off >= 0 {
		return off, nil
	}
	retry := isRetryTopic(q.Topic)
	switch pc.cfg.push.from.where {
	case protocol.ConsumeFromFirstOffset:
		return 0, nil
	case protocol.ConsumeFromTimestamp:
		if retry {
			return pc.c.MaxOffset(rctx, q)
		}
		return pc.c.SearchOffset(rctx, q, pc.cfg.push.from.at)
	default:
		if retry {
			return 0, nil
		}
		return pc.c.MaxOffset(rctx, q)
	}
}

// moved handles PULL_OFFSET_MOVED: the queue is dropped (its results still
// to come discarded), its offset set to where the broker said reading can
// resume and stored, and a fresh queue started from there (Java drops the
// process queue and the next rebalance re-creates it).
func (pq *pushQueue) moved(next int64) {
	pc := pq.pc
	pq.dropped.Store(true)
	pc.offsets.update(pq.mq, next, false)
	ctx, cancel := context.WithTimeout(context.Background(), pc.cfg.timeout)
	if err := pc.offsets.persist(ctx, []protocol.MessageQueue{pq.mq}); err != nil {
		pc.log.Warn("client: storing a moved offset failed", "queue", pq.mq, "err", err)
	}
	cancel()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.mu.state != groupStarted || pc.mu.queues[pq.mq] != pq || pc.runCtx.Err() != nil {
		return
	}
	fresh := newPushQueue(pc, pq.mq)
	pc.mu.queues[pq.mq] = fresh
	if !pc.goStart("push-pull", fresh.pullLoop) {
		close(fresh.pullDone)
	}
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
