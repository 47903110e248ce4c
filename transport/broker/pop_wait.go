package broker

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// popWaiters holds parked POP_MESSAGE and NOTIFICATION requests (Java's
// PopLongPollingService): by topic, and by deadline. A message stored in a
// queue of the topic (or in its group's pop retry topic, or an orderly ack
// that unblocks a queue) wakes the topic's requests for that queue and
// those for every queue (-1); the run goroutine re-serves them (a pop
// that still finds nothing is parked again until its poll time ends) and
// answers those whose poll time ended. Lock order: after the pop
// service's mu; never held while serving or answering.
type popWaiters struct {
	p    *popService
	n    atomic.Int64 // parked requests (fast path of wake)
	kick chan struct{}

	mu struct {
		sync.Mutex
		closed  bool
		byTopic map[string][]*popRequest
		byTime  popHeap
		ready   []*popRequest
	}
}

func newPopWaiters(p *popService) *popWaiters {
	w := &popWaiters{p: p, kick: make(chan struct{}, 1)}
	w.mu.byTopic = make(map[string][]*popRequest)
	return w
}

func (w *popWaiters) signal() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// park registers pr (deferring its answer) until a wake-up or its deadline.
func (w *popWaiters) park(pr *popRequest) parkResult {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.closed {
		return parkClosed
	}
	if int(w.n.Load()) >= w.p.cfg.maxPolling {
		return parkFull
	}
	same := 0
	for _, o := range w.mu.byTopic[pr.h.Topic] {
		if o.h.ConsumerGroup == pr.h.ConsumerGroup && o.h.QueueID == pr.h.QueueID {
			same++
		}
	}
	if same > w.p.cfg.maxPollingPerKey {
		return parkFull
	}
	pr.rc.Defer()
	w.mu.byTopic[pr.h.Topic] = append(w.mu.byTopic[pr.h.Topic], pr)
	heap.Push(&w.mu.byTime, pr)
	w.n.Add(1)
	if w.mu.byTime[0] == pr {
		w.signal() // a new earliest deadline
	}
	return parked
}

// wake moves the requests of topic for queue (and for every queue) to the
// ready list; group "" matches every group, queue -2 every queue.
func (w *popWaiters) wake(topic, group string, queue int32) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	list := w.mu.byTopic[topic]
	keep := list[:0]
	woke := false
	for _, pr := range list {
		if (group == "" || pr.h.ConsumerGroup == group) && (queue == -2 || pr.h.QueueID < 0 || pr.h.QueueID == queue) {
			w.removeTimedLocked(pr)
			w.mu.ready = append(w.mu.ready, pr)
			woke = true
		} else {
			keep = append(keep, pr)
		}
	}
	clear(list[len(keep):])
	if len(keep) == 0 {
		delete(w.mu.byTopic, topic)
	} else {
		w.mu.byTopic[topic] = keep
	}
	w.mu.Unlock()
	if woke {
		w.signal()
	}
}

func (w *popWaiters) removeTimedLocked(pr *popRequest) {
	if pr.index >= 0 {
		heap.Remove(&w.mu.byTime, pr.index)
		w.n.Add(-1)
	}
}

func (w *popWaiters) removeTopicLocked(pr *popRequest) {
	list := w.mu.byTopic[pr.h.Topic]
	for i, o := range list {
		if o == pr {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.mu.byTopic, pr.h.Topic)
	} else {
		w.mu.byTopic[pr.h.Topic] = list
	}
}

// count returns the requests parked for topic, group and queue.
func (w *popWaiters) count(topic, group string, queue int32) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, pr := range w.mu.byTopic[topic] {
		if pr.h.ConsumerGroup == group && pr.h.QueueID == queue {
			n++
		}
	}
	return n
}

// dropConn forgets the requests of a closed connection.
func (w *popWaiters) dropConn(sc *remoting.ServerConn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := 0; i < len(w.mu.byTime); {
		pr := w.mu.byTime[i]
		if pr.rc.Conn() != sc {
			i++
			continue
		}
		w.removeTopicLocked(pr)
		w.removeTimedLocked(pr)
	}
}

// close stops parking; with answer, every parked request is answered now
// (nothing found), else they are dropped (their connections close).
func (w *popWaiters) close(answer bool) {
	w.mu.Lock()
	w.mu.closed = true
	all := append(w.mu.ready, w.mu.byTime...)
	w.mu.ready, w.mu.byTime = nil, nil
	clear(w.mu.byTopic)
	w.n.Store(0)
	w.mu.Unlock()
	if !answer {
		return
	}
	for _, pr := range all {
		pr.index = -1
		if pr.notify {
			w.p.answerNotification(pr, false, false)
		} else {
			w.p.answerPop(pr, protocol.ResPollingTimeout, "NO_MESSAGE_IN_QUEUE", popResult{popTime: w.p.nowMS()})
		}
	}
}

// run re-serves woken requests and answers expired ones until ctx ends.
func (w *popWaiters) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var batch []*popRequest
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
		}
		now := time.Now()
		w.mu.Lock()
		batch = append(batch[:0], w.mu.ready...)
		clear(w.mu.ready)
		w.mu.ready = w.mu.ready[:0]
		for len(w.mu.byTime) > 0 && !w.mu.byTime[0].deadline.After(now) {
			pr := w.mu.byTime[0]
			w.removeTopicLocked(pr)
			w.removeTimedLocked(pr)
			batch = append(batch, pr)
		}
		next := time.Hour
		if len(w.mu.byTime) > 0 {
			next = w.mu.byTime[0].deadline.Sub(now)
		}
		w.mu.Unlock()
		t.Reset(next)
		for i, pr := range batch {
			w.p.serve(pr)
			batch[i] = nil
		}
	}
}

// popHeap orders parked requests by deadline (container/heap).
type popHeap []*popRequest

func (h popHeap) Len() int           { return len(h) }
func (h popHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h popHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *popHeap) Push(x any) {
	pr := x.(*popRequest)
	pr.index = len(*h)
	*h = append(*h, pr)
}

func (h *popHeap) Pop() any {
	old := *h
	n := len(old)
	pr := old[n-1]
	old[n-1] = nil
	pr.index = -1
	*h = old[:n-1]
	return pr
}
