package rocketmq

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Output floors. Every transaction description records, per output queue
// of its half messages, an offset of that queue observed before the epoch
// was pre-committed (its floor): the epoch's commit starts only once the
// checkpoint is durable, after the pre-commit, so every committed copy of
// its half messages is stored at or after the floor. A restore reads the
// queues from their floors to find what a crashed run committed
// (restorecheck.go), because Apache RocketMQ's broker stores a half
// message again for every END_TRANSACTION commit.
//
// Floors come from the queues' max offsets (GET_MAX_OFFSET): a queue seen
// for the first time is asked at the pre-commit (in parallel, with the
// sink's retries); after every pre-commit the tracker asks every queue it
// knows again on a goroutine of its own, so that later epochs' floors are
// recent (a restore reads about the last two epochs' output) without a
// round trip on the checkpoint's path.

// floorTracker holds the latest observed max offset of each output queue.
// Its methods are safe for concurrent use.
type floorTracker struct {
	c        *client.Client
	attempts int
	retry    backoff.Policy
	timeout  time.Duration // per request; 0: the client's request timeout

	// ctx ends with close; it bounds the refresh goroutine, which wg joins.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     struct {
		sync.Mutex
		known      map[queueKey]int64
		refreshing bool
		closed     bool
	}
}

func newFloorTracker(c *client.Client, attempts int, retry backoff.Policy, timeout time.Duration) *floorTracker {
	f := &floorTracker{c: c, attempts: attempts, retry: retry, timeout: timeout}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.mu.known = make(map[queueKey]int64)
	return f
}

// floorsOf returns the floors of the output queues of hs (task goroutine,
// in PreCommit): the latest observed offsets, asking the broker (in
// parallel, with retries) for queues never observed before.
func (f *floorTracker) floorsOf(ctx context.Context, hs []txnHandle) (map[queueKey]int64, error) {
	floors := make(map[queueKey]int64, 4)
	var missing []queueKey
	f.mu.Lock()
	last := queueKey{queue: -1}
	for i := range hs {
		k := queueOf(&hs[i].h)
		if k == last {
			continue
		}
		last = k
		if _, ok := floors[k]; ok {
			continue
		}
		if v, ok := f.mu.known[k]; ok {
			floors[k] = v
			continue
		}
		floors[k] = -1
		missing = append(missing, k)
	}
	f.mu.Unlock()
	if len(missing) == 0 {
		return floors, nil
	}
	offs := make([]int64, len(missing))
	errs := make([]error, len(missing))
	var wg sync.WaitGroup
	for i, k := range missing {
		wg.Go(func() { offs[i], errs[i] = f.observe(ctx, k) })
	}
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range missing {
		if errs[i] != nil {
			return nil, fmt.Errorf("rocketmq sink: observing output queue %s/%s/%d before the pre-commit: %w", k.broker, k.topic, k.queue, errs[i])
		}
		floors[k] = offs[i]
		if _, ok := f.mu.known[k]; !ok {
			f.mu.known[k] = offs[i]
		}
	}
	return floors, nil
}

// observe asks the broker for k's max offset, with retries.
func (f *floorTracker) observe(ctx context.Context, k queueKey) (int64, error) {
	var off int64
	err := backoff.Retry(ctx, f.retry, f.attempts, nil, func(int) error {
		actx, cancel := attemptCtx(ctx, f.timeout)
		defer cancel()
		var err error
		off, err = f.c.MaxOffset(actx, protocol.MessageQueue{Topic: k.topic, BrokerName: k.broker, QueueID: k.queue})
		return err
	})
	return off, err
}

// refresh asks every known queue for its max offset again, on a goroutine
// of the tracker, unless a refresh is running (task goroutine, after a
// pre-commit). A failed request keeps the queue's previous floor.
func (f *floorTracker) refresh() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.refreshing || f.mu.closed || len(f.mu.known) == 0 {
		return
	}
	f.mu.refreshing = true
	keys := make([]queueKey, 0, len(f.mu.known))
	for k := range f.mu.known {
		keys = append(keys, k)
	}
	f.wg.Go(func() {
		ctx := f.ctx // each request also bounded by its timeout
		for _, k := range keys {
			actx, cancel := attemptCtx(ctx, f.timeout)
			off, err := f.c.MaxOffset(actx, protocol.MessageQueue{Topic: k.topic, BrokerName: k.broker, QueueID: k.queue})
			cancel()
			if err != nil {
				continue
			}
			f.mu.Lock()
			f.mu.known[k] = off
			f.mu.Unlock()
		}
		f.mu.Lock()
		f.mu.refreshing = false
		f.mu.Unlock()
	})
}

// close stops further refreshes and waits for the one running.
func (f *floorTracker) close() {
	f.mu.Lock()
	f.mu.closed = true
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
}
