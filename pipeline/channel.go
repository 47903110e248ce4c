package pipeline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// batchSize is the number of records per channel message and per source
// poll; queueLen the number of messages buffered per (sender, receiver)
// pair. Together they bound what is in flight between two tasks.
const (
	batchSize = 256
	queueLen  = 8
)

type msgKind uint8

const (
	msgData msgKind = iota
	msgBarrier
	msgWatermark
	msgEOS
)

// message is what travels between tasks: a batch of records (ownership
// passes to the receiver, which returns the slice to the pool), a barrier,
// a watermark or the end of a sender's stream.
type message[R any] struct {
	kind  msgKind
	stop  bool
	id    uint64
	wm    int64
	batch *[]R
	// keys, for a batch of krec, holds the records' encoded keys end to
	// end (krec.kend); it goes back to inbox.keys with the batch.
	keys *[]byte
	// traces lists the batch's traced records (hooks.go), nil when none.
	traces []tracedAt
}

// ring is a fixed-capacity FIFO of messages.
type ring[R any] struct {
	buf     []message[R]
	head, n int
}

func (r *ring[R]) push(m message[R]) {
	r.buf[(r.head+r.n)%len(r.buf)] = m
	r.n++
}

func (r *ring[R]) pop() message[R] {
	m := r.buf[r.head]
	r.buf[r.head] = message[R]{}
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return m
}

// inbox is a task's input: one bounded queue per sender, so that a sender
// whose barrier arrived can be blocked (alignment) while the others are
// still read, and backpressure reaches exactly the senders that are ahead.
// Senders call push from their own goroutines; one receiver calls pop,
// block and unblockAll.
type inbox[R any] struct {
	notify chan struct{}   // receiver wake-up, cap 1
	space  []chan struct{} // per-sender wake-up, cap 1; grows under mu (addSender)
	pool   *sync.Pool      // of *[]R with capacity batchSize
	keys   *sync.Pool      // of the batches' key arenas (message.keys); nil when they have none
	// blocked[sender], when set, accumulates the nanoseconds the sender
	// waited for room (backpressure; hooks.go). Guarded by mu.
	blocked []*atomic.Int64

	mu struct {
		sync.Mutex
		q       []ring[R]
		blocked []bool
		next    int
	}
}

func newInbox[R any](senders int, pool *sync.Pool) *inbox[R] {
	in := &inbox[R]{notify: make(chan struct{}, 1), space: make([]chan struct{}, senders), pool: pool}
	in.mu.q = make([]ring[R], senders)
	in.mu.blocked = make([]bool, senders)
	for i := range senders {
		in.space[i] = make(chan struct{}, 1)
		in.mu.q[i].buf = make([]message[R], queueLen)
	}
	return in
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// push appends m to sender's queue, blocking while it is full.
func (in *inbox[R]) push(ctx context.Context, sender int, m message[R]) error {
	for {
		in.mu.Lock()
		q := &in.mu.q[sender]
		if q.n < len(q.buf) {
			q.push(m)
			in.mu.Unlock()
			poke(in.notify)
			return nil
		}
		space := in.space[sender]
		in.mu.Unlock()
		start := time.Now()
		select {
		case <-space:
			in.addBlocked(sender, start)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type popResult uint8

const (
	popMessage popResult = iota
	popWake
	popEvent
	popTimer
	popDone
)

// pop returns the next message of an unblocked sender, round robin. Before
// blocking it calls idle (to flush partial output batches); it returns
// popWake, popEvent, popTimer or popDone when wake, events, timer or ctx
// fire first (a nil channel never does).
func (in *inbox[R]) pop(ctx context.Context, wake, events <-chan struct{}, timer <-chan time.Time, idle func() error) (int, message[R], popResult, error) {
	idled := false
	for {
		in.mu.Lock()
		n := len(in.mu.q)
		for i := range n {
			j := (in.mu.next + i) % n
			if in.mu.blocked[j] || in.mu.q[j].n == 0 {
				continue
			}
			m := in.mu.q[j].pop()
			in.mu.next = (j + 1) % n
			space := in.space[j]
			in.mu.Unlock()
			poke(space)
			return j, m, popMessage, nil
		}
		in.mu.Unlock()
		if !idled && idle != nil {
			idled = true
			if err := idle(); err != nil {
				return 0, message[R]{}, popDone, err
			}
			continue
		}
		select {
		case <-in.notify:
		case <-wake:
			return 0, message[R]{}, popWake, nil
		case <-events:
			return 0, message[R]{}, popEvent, nil
		case <-timer:
			return 0, message[R]{}, popTimer, nil
		case <-ctx.Done():
			return 0, message[R]{}, popDone, ctx.Err()
		}
	}
}

// recycle returns a processed data message's batch (and key arena) to
// their pools.
func (in *inbox[R]) recycle(m message[R]) {
	putBatch(in.pool, m.batch)
	if m.keys != nil {
		in.keys.Put(m.keys)
	}
}

// pushAll pushes m from sender to every inbox of ins (a barrier, a
// watermark or the end of stream of a port to many subtasks).
func pushAll[R any](ctx context.Context, ins []*inbox[R], sender int, m message[R]) error {
	for _, in := range ins {
		if err := in.push(ctx, sender, m); err != nil {
			return err
		}
	}
	return nil
}

func (in *inbox[R]) block(sender int) {
	in.mu.Lock()
	in.mu.blocked[sender] = true
	in.mu.Unlock()
}

func (in *inbox[R]) unblock(sender int) {
	in.mu.Lock()
	in.mu.blocked[sender] = false
	in.mu.Unlock()
}

func (in *inbox[R]) unblockAll() {
	in.mu.Lock()
	clear(in.mu.blocked)
	in.mu.Unlock()
}

// getBatch takes an empty batch from the pool.
func getBatch[R any](pool *sync.Pool) *[]R {
	b := pool.Get().(*[]R)
	*b = (*b)[:0]
	return b
}

// putBatch clears a processed batch (so it pins no records) and returns it.
func putBatch[R any](pool *sync.Pool, b *[]R) {
	clear(*b)
	*b = (*b)[:0]
	pool.Put(b)
}

func newBatchPool[R any]() *sync.Pool {
	return &sync.Pool{New: func() any {
		s := make([]R, 0, batchSize)
		return &s
	}}
}

// aligner tracks barrier alignment over a task's senders. A sender that
// delivered the newest barrier is blocked until every live sender
// delivered it; senders that ended (EOS) count as aligned. A newer barrier
// overtaking an older alignment (after an aborted checkpoint) supersedes it.
type aligner struct {
	lastSeen []uint64
	eos      []bool
	live     int
	maxSeen  uint64
	maxStop  bool
	done     uint64
}

func newAligner(senders int) *aligner {
	return &aligner{lastSeen: make([]uint64, senders), eos: make([]bool, senders), live: senders}
}

// barrier records barrier id from sender; it returns the senders to block
// and to unblock via the callbacks, and whether alignment completed.
func (a *aligner) barrier(sender int, id uint64, stop bool, block, unblock func(int)) (complete bool) {
	a.lastSeen[sender] = id
	if id > a.maxSeen {
		a.maxSeen, a.maxStop = id, stop
		for s, seen := range a.lastSeen {
			if s != sender && seen < id && !a.eos[s] {
				unblock(s)
			}
		}
	}
	if id == a.maxSeen {
		block(sender)
	}
	return a.aligned()
}

// end records the end of sender's stream; it reports whether an alignment in
// progress completed.
func (a *aligner) end(sender int) bool {
	if !a.eos[sender] {
		a.eos[sender] = true
		a.live--
	}
	return a.aligned()
}

func (a *aligner) aligned() bool {
	if a.maxSeen <= a.done {
		return false
	}
	for s, seen := range a.lastSeen {
		if !a.eos[s] && seen != a.maxSeen {
			return false
		}
	}
	a.done = a.maxSeen
	return true
}

func (a *aligner) allEnded() bool { return a.live == 0 }
