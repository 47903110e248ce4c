package broker

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/remoting"
)

// parkResult tells what park did with a pull.
type parkResult int

const (
	parked     parkResult = iota
	parkFull              // maxParked reached: answer SYSTEM_BUSY now
	parkClosed            // shutting down: answer PULL_NOT_FOUND now
)

// longPoll holds parked pulls (protocol §7.5 long polling).
//
// A pull with the SUSPEND flag that finds nothing new is parked here,
// keyed by (topic, queue) and by deadline. The store's Notify hook (called
// on the store's committer goroutine after every durable write) moves the
// waiters of that queue whose offset is now below the max offset to a
// ready list and wakes the run goroutine, which re-processes them (without
// parking again) and answers. The same goroutine answers pulls whose
// deadline passed, also by re-processing them, so a missed wake-up costs
// latency, never a lost message. Waiters of a closed connection are dropped
// from the broker's OnDisconnect; Shutdown answers every waiter.
//
// Lock order: longPoll.mu is a leaf; it is never held while answering.
type longPoll struct {
	b     *Broker
	count atomic.Int64 // parked pulls (fast path of notify)
	wake  chan struct{}

	mu struct {
		sync.Mutex
		closed  bool
		byQueue map[queueKey][]*pullReq
		byTime  pullHeap
		ready   []*pullReq
	}
}

func newLongPoll(b *Broker) *longPoll {
	lp := &longPoll{b: b, wake: make(chan struct{}, 1)}
	lp.mu.byQueue = make(map[queueKey][]*pullReq)
	return lp
}

func (lp *longPoll) signal() {
	select {
	case lp.wake <- struct{}{}:
	default:
	}
}

// park registers p (after rc.Defer) to be answered when its queue grows or
// after d.
func (lp *longPoll) park(p *pullReq, d time.Duration) parkResult {
	lp.mu.Lock()
	if lp.mu.closed {
		lp.mu.Unlock()
		return parkClosed
	}
	if lp.b.cfg.maxParked > 0 && lp.count.Load() >= int64(lp.b.cfg.maxParked) {
		lp.mu.Unlock()
		return parkFull
	}
	if lp.b.cfg.maxParked == 0 {
		lp.mu.Unlock()
		return parkClosed
	}
	p.rc.Defer()
	from := max(p.h.QueueOffset, p.scanFrom) // p is the run loop's once registered
	p.deadline = time.Now().Add(d)
	lp.mu.byQueue[p.key] = append(lp.mu.byQueue[p.key], p)
	heap.Push(&lp.mu.byTime, p)
	lp.count.Add(1)
	first := len(lp.mu.byTime) == 1 || lp.mu.byTime[0] == p
	lp.mu.Unlock()
	if first {
		lp.signal() // the run loop's timer must see the new earliest deadline
	}
	// A message stored between the lookup and the registration above
	// notified nobody: check once more.
	if maxOff, err := lp.b.store.MaxOffset(p.key.topic, p.key.queue); err == nil && maxOff > from {
		lp.notify(p.key.topic, p.key.queue, maxOff)
	}
	return parked
}

// notify is the store's Notify hook: the queue's max offset is now
// maxOffset. It must not block (it runs on the store's committer).
func (lp *longPoll) notify(topic string, queue int32, maxOffset int64) {
	if p := lp.b.pop; p != nil {
		p.notifyArrival(topic, queue) // pop_wait.go: parked POP requests
	}
	if lp.count.Load() == 0 {
		return
	}
	key := queueKey{topic, queue}
	lp.mu.Lock()
	list := lp.mu.byQueue[key]
	if len(list) == 0 {
		lp.mu.Unlock()
		return
	}
	keep := list[:0]
	woke := false
	for _, p := range list {
		if max(p.h.QueueOffset, p.scanFrom) < maxOffset {
			lp.removeTimedLocked(p)
			lp.mu.ready = append(lp.mu.ready, p)
			woke = true
		} else {
			keep = append(keep, p)
		}
	}
	clear(list[len(keep):])
	if len(keep) == 0 {
		delete(lp.mu.byQueue, key)
	} else {
		lp.mu.byQueue[key] = keep
	}
	lp.mu.Unlock()
	if woke {
		lp.signal()
	}
}

// removeTimedLocked takes p out of the deadline heap and the count.
func (lp *longPoll) removeTimedLocked(p *pullReq) {
	if p.index >= 0 {
		heap.Remove(&lp.mu.byTime, p.index)
		lp.count.Add(-1)
	}
}

// removeQueuedLocked takes p out of its queue's list.
func (lp *longPoll) removeQueuedLocked(p *pullReq) {
	list := lp.mu.byQueue[p.key]
	for i, q := range list {
		if q == p {
			last := len(list) - 1
			list[i] = list[last]
			list[last] = nil
			list = list[:last]
			break
		}
	}
	if len(list) == 0 {
		delete(lp.mu.byQueue, p.key)
	} else {
		lp.mu.byQueue[p.key] = list
	}
}

// dropConn forgets the waiters of a closed connection (nobody to answer).
func (lp *longPoll) dropConn(sc *remoting.ServerConn) {
	if p := lp.b.pop; p != nil {
		p.waiters.dropConn(sc)
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	for i := 0; i < len(lp.mu.byTime); {
		p := lp.mu.byTime[i]
		if p.rc.Conn() != sc {
			i++
			continue
		}
		lp.removeQueuedLocked(p)
		lp.removeTimedLocked(p) // moves another element to i
	}
}

// close stops parking. With answer, every waiter is re-processed and
// answered now (graceful shutdown); without, waiters are dropped (their
// connections are being closed).
func (lp *longPoll) close(answer bool) {
	if p := lp.b.pop; p != nil {
		p.waiters.close(answer)
	}
	lp.mu.Lock()
	lp.mu.closed = true
	all := append(lp.mu.ready, lp.mu.byTime...)
	lp.mu.ready = nil
	lp.mu.byTime = nil
	clear(lp.mu.byQueue)
	lp.count.Store(0)
	lp.mu.Unlock()
	for _, p := range all {
		p.index = -1
		if answer {
			lp.b.pullOnce(p, false)
		}
	}
}

// run answers woken and expired pulls until ctx ends.
func (lp *longPoll) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var batch []*pullReq
	for {
		select {
		case <-ctx.Done():
			return
		case <-lp.wake:
		case <-t.C:
		}
		now := time.Now()
		lp.mu.Lock()
		batch = append(batch[:0], lp.mu.ready...)
		clear(lp.mu.ready)
		lp.mu.ready = lp.mu.ready[:0]
		for len(lp.mu.byTime) > 0 && !lp.mu.byTime[0].deadline.After(now) {
			p := lp.mu.byTime[0]
			lp.removeQueuedLocked(p)
			lp.removeTimedLocked(p)
			batch = append(batch, p)
		}
		next := time.Hour
		if len(lp.mu.byTime) > 0 {
			next = lp.mu.byTime[0].deadline.Sub(now)
		}
		lp.mu.Unlock()
		t.Reset(next)
		for i, p := range batch {
			lp.b.pullOnce(p, false)
			batch[i] = nil
		}
	}
}

// pullHeap orders parked pulls by deadline (container/heap).
type pullHeap []*pullReq

func (h pullHeap) Len() int           { return len(h) }
func (h pullHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h pullHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *pullHeap) Push(x any) {
	p := x.(*pullReq)
	p.index = len(*h)
	*h = append(*h, p)
}

func (h *pullHeap) Pop() any {
	old := *h
	n := len(old)
	p := old[n-1]
	old[n-1] = nil
	p.index = -1
	*h = old[:n-1]
	return p
}
