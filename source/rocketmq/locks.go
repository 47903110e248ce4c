package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/source"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// Queue locks (WithQueueLocking). One job process owns the queues it reads:
// before reading, the source takes the broker lock (LOCK_BATCH_MQ) of every
// queue of the topic under its consumer group, through a locking
// client.GroupConsumer whose allocator gives this member every queue. The
// GroupConsumer renews the locks; a queue whose renewal is refused or whose
// validity lapses is reported lost, and the split reading it fails its next
// Poll with ErrQueueLockLost (fencing: the job stops instead of reading a
// queue another process now owns). A process that does not get the locks
// waits in Splits (the job does not start) until they are free or the wait
// bound (WithLockWait) passes.
//
// The broker grants a lock held by the same client id, and keeps the locks
// of a killed process until they expire (60 s by default). A client with
// the same instance name on every run of the same job (InstanceName derives
// one from the job name and checkpoint directory; a Dial source bound to
// the job names its client so by itself) re-acquires its locks at once
// after a restart, while another job process (another checkpoint
// directory) waits.

var (
	// ErrQueueLockLost is returned by Poll (wrapped, naming the queue) once
	// the broker lock of the split's queue was lost: another client may own
	// the queue now, so the job must stop.
	ErrQueueLockLost = errors.New("rocketmq source: broker queue lock lost (another client may own the queue)")
	// ErrQueueLocked is returned by Splits and Open (wrapped, naming the
	// queues) when the queue locks were not granted within WithLockWait:
	// another client holds them.
	ErrQueueLocked = errors.New("rocketmq source: broker queue locks held by another client")
)

// InstanceName returns a client instance name (for client.WithInstanceName)
// that is the same on every run of job with checkpoint directory dir, and
// differs between jobs or directories: "runnel-" and 16 hex digits. A Dial
// source bound to a job gives it to its client by itself.
func InstanceName(job, dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(job))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(dir))
	return "runnel-" + strconv.FormatUint(h.Sum64()|1<<63, 16)
}

// queueLocks is the lock holder of one Source.
type queueLocks struct {
	s       *Source
	g       *client.GroupConsumer
	changed chan struct{} // poked when owned or lost change, cap 1
	anyLost atomic.Bool   // fast path of lost

	mu struct {
		sync.Mutex
		owned map[protocol.MessageQueue]bool
		lost  map[protocol.MessageQueue]bool
	}
}

// locker returns the source's lock holder, starting it on first use.
func (s *Source) locker(ctx context.Context) (*queueLocks, error) {
	s.lk.Lock()
	defer s.lk.Unlock()
	if s.lk.q != nil {
		return s.lk.q, nil
	}
	if s.lk.closed {
		return nil, ErrClosed
	}
	ql := &queueLocks{s: s, changed: make(chan struct{}, 1)}
	ql.mu.owned = make(map[protocol.MessageQueue]bool)
	ql.mu.lost = make(map[protocol.MessageQueue]bool)
	every := client.AllocatorFunc(func(_ string, _ []string, all []protocol.MessageQueue) []protocol.MessageQueue { return all })
	opts := []client.GroupOption{
		client.WithQueueLocking(true),
		client.WithAllocator(every),
		client.WithListener(client.ListenerFuncs{Assign: ql.assign, Revoke: ql.revoke, LockLost: ql.lockLost}),
		client.WithLockRenewInterval(s.cfg.lockRenew), client.WithLockValidity(s.cfg.lockValidity),
	}
	g, err := client.NewGroupConsumer(s.c, s.cfg.group, opts...)
	if err != nil {
		return nil, fmt.Errorf("rocketmq source: queue locks: %w", err)
	}
	expr := s.cfg.tagExpr
	if expr == "" {
		expr = "*"
	}
	if err := g.Subscribe(s.topic, expr); err != nil {
		return nil, fmt.Errorf("rocketmq source: queue locks: %w", err)
	}
	if err := g.Start(ctx); err != nil {
		return nil, fmt.Errorf("rocketmq source: queue locks: %w", err)
	}
	ql.g = g
	s.lk.q = ql
	return ql, nil
}

func (ql *queueLocks) poke() {
	select {
	case ql.changed <- struct{}{}:
	default:
	}
}

func (ql *queueLocks) assign(_ context.Context, qs []protocol.MessageQueue) {
	ql.mu.Lock()
	for _, q := range qs {
		if !ql.mu.lost[q] {
			ql.mu.owned[q] = true
		}
	}
	ql.mu.Unlock()
	ql.poke()
}

func (ql *queueLocks) revoke(_ context.Context, qs []protocol.MessageQueue) {
	ql.mu.Lock()
	for _, q := range qs {
		delete(ql.mu.owned, q)
	}
	ql.mu.Unlock()
	ql.poke()
}

func (ql *queueLocks) lockLost(_ context.Context, qs []protocol.MessageQueue) {
	ql.mu.Lock()
	for _, q := range qs {
		if ql.mu.owned[q] {
			delete(ql.mu.owned, q)
			ql.mu.lost[q] = true
			ql.anyLost.Store(true)
		}
	}
	ql.mu.Unlock()
	ql.s.log.Error("broker queue locks lost: the splits reading them fail", "queues", len(qs), "group", ql.s.cfg.group)
	ql.poke()
}

// lost returns an error wrapping ErrQueueLockLost when q's lock was lost.
// It is cheap while no lock was lost.
func (ql *queueLocks) lost(q protocol.MessageQueue) error {
	if !ql.anyLost.Load() {
		return nil
	}
	ql.mu.Lock()
	defer ql.mu.Unlock()
	if ql.mu.lost[q] {
		return fmt.Errorf("%w: %s (group %s)", ErrQueueLockLost, q.String(), ql.s.cfg.group)
	}
	return nil
}

// await blocks until every queue of qs is locked by this client, a lock
// of one of them was lost, the wait bound passed or ctx is done.
func (ql *queueLocks) await(ctx context.Context, qs []protocol.MessageQueue) error {
	var bound <-chan time.Time
	if d := ql.s.cfg.lockWait; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		bound = t.C
	}
	logged := false
	for {
		var missing []string
		ql.mu.Lock()
		for _, q := range qs {
			if ql.mu.lost[q] {
				ql.mu.Unlock()
				return fmt.Errorf("%w: %s (group %s)", ErrQueueLockLost, q.String(), ql.s.cfg.group)
			}
			if !ql.mu.owned[q] {
				missing = append(missing, q.String())
			}
		}
		ql.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		ql.g.Rebalance() // new queues: do not wait for the periodic rebalance
		if !logged {
			logged = true
			ql.s.log.Warn("waiting for broker queue locks (another client of the group holds them, or they are not granted yet)",
				"group", ql.s.cfg.group, "queues", missing)
		}
		select {
		case <-ql.changed:
		case <-bound:
			return fmt.Errorf("%w: group %s, queues %v", ErrQueueLocked, ql.s.cfg.group, missing)
		case <-ctx.Done():
			return fmt.Errorf("rocketmq source: waiting for queue locks %v: %w", missing, ctx.Err())
		}
	}
}

// lockQueues takes (or waits for) the locks of the splits' queues when
// queue locking is on.
func (s *Source) lockQueues(ctx context.Context, splits ...source.Split) error {
	if !s.cfg.locks {
		return nil
	}
	ql, err := s.locker(ctx)
	if err != nil {
		return err
	}
	qs := make([]protocol.MessageQueue, 0, len(splits))
	for _, sp := range splits {
		b, id, err := parseSplitID(sp.ID)
		if err != nil {
			return err
		}
		qs = append(qs, protocol.MessageQueue{Topic: s.topic, BrokerName: b, QueueID: id})
	}
	return ql.await(ctx, qs)
}

// Close releases the source's broker queue locks (WithQueueLocking), if it
// took any, and closes the client of a Dial source: call it after the job
// ended (and, for a New source, before closing the Client). It is
// idempotent; a New source without queue locks has nothing to release.
func (s *Source) Close() error {
	s.lk.Lock()
	ql := s.lk.q
	s.lk.q, s.lk.closed = nil, true
	s.lk.Unlock()
	var err error
	if ql != nil {
		err = ql.g.Close()
	}
	if s.dial != nil {
		s.mu.Lock()
		c := s.c
		closed := s.mu.closed
		s.mu.closed = true
		s.mu.Unlock()
		if c != nil && !closed {
			err = errors.Join(err, c.Close())
		}
	}
	return err
}

// fenced fails Poll once the split's queue lock was lost.
type fenced[T any] struct {
	source.SplitReader[T]
	locks *queueLocks
	q     protocol.MessageQueue
}

// Lag implements source.LagReporter: the fenced reader's lag.
func (f *fenced[T]) Lag() (int64, bool) {
	if lr, ok := f.SplitReader.(source.LagReporter); ok {
		return lr.Lag()
	}
	return 0, false
}

func (f *fenced[T]) Poll(ctx context.Context, n int) ([]source.Record[T], error) {
	if err := f.locks.lost(f.q); err != nil {
		return nil, err
	}
	return f.SplitReader.Poll(ctx, n)
}
