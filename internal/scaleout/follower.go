package scaleout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// followSuspend is how long a follower's pull waits on the broker for a
// new record (long polling).
const followSuspend = 10 * time.Second

// ErrChainTruncated is returned (wrapped, with the queue) when a task's
// commit chain cannot be validated: its first records were deleted by the
// broker's retention and no hint names a valid record to start from, the
// record the hint names is past the queue's end, or (Claim) the chain is
// empty while the task's changelog is not. Records the task's state
// depends on are gone: the task must not start empty.
var ErrChainTruncated = errors.New("scaleout: commit chain truncated")

// Follower keeps the commit chains of a job's tasks up to date, one
// long-polling pull loop per commit queue, and answers from them: any
// worker decides with it whether a tagged message or a sink transaction of
// any task counts. It is safe for concurrent use.
type Follower struct {
	c     *client.Client
	group string
	log   *slog.Logger
	// betweenReads, when set (by this package's tests), runs between
	// start's read of the hint and its read of the queue's bounds.
	betweenReads func()

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu struct {
		sync.Mutex
		queues  map[protocol.MessageQueue]*followed
		tasks   map[string]*followed
		changed chan struct{} // closed and replaced whenever a chain changes
		closed  bool
	}
}

// followed is one commit queue (one task's chain) being followed.
type followed struct {
	task  string
	q     protocol.MessageQueue
	chain *Chain
	// next is the queue offset up to which records were applied.
	next int64
	// ready is closed once the chain is read up to the queue's end as of
	// when following started.
	ready chan struct{}
	err   error // a terminal error of the chain (ErrChainTruncated)
}

// NewFollower returns a Follower using c; hints (the offsets of confirmed
// records) are read as group's consumer offsets of the commit queues.
// Close stops it.
func NewFollower(c *client.Client, group string, log *slog.Logger) *Follower {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Follower{c: c, group: group, log: log}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.mu.queues = map[protocol.MessageQueue]*followed{}
	f.mu.tasks = map[string]*followed{}
	f.mu.changed = make(chan struct{})
	return f
}

// Follow starts following task's chain on commit queue q (no-op when it is
// already followed). It does not block.
func (f *Follower) Follow(task string, q protocol.MessageQueue) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.closed || f.mu.queues[q] != nil {
		return
	}
	fw := &followed{task: task, q: q, chain: NewChain(task), next: -1, ready: make(chan struct{})}
	f.mu.queues[q] = fw
	f.mu.tasks[task] = fw
	f.wg.Go(func() { f.run(fw) })
}

// Close stops following and waits for the pull loops. It is idempotent.
func (f *Follower) Close() error {
	f.mu.Lock()
	f.mu.closed = true
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
	return nil
}

// Changed returns a channel closed at the next change of any chain.
func (f *Follower) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.changed
}

func (f *Follower) notifyLocked() {
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
}

// Ready waits until task's chain has been read up to where its queue ended
// when following started (so Latest and Decide reflect everything written
// before), or ctx ends. It returns the chain's terminal error, if any.
func (f *Follower) Ready(ctx context.Context, task string) error {
	f.mu.Lock()
	fw := f.mu.tasks[task]
	f.mu.Unlock()
	if fw == nil {
		return fmt.Errorf("scaleout: task %s is not followed", task)
	}
	select {
	case <-fw.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return fw.err
}

// Decide is Chain.Decide on task's chain (Undecided for a task not
// followed or not read yet; the chain's terminal error, if any).
func (f *Follower) Decide(task string, ownerEpoch, epoch uint64) (Verdict, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fw := f.mu.tasks[task]
	if fw == nil {
		return Undecided, nil
	}
	if fw.err != nil {
		return Unknown, fw.err
	}
	return fw.chain.Decide(ownerEpoch, epoch), nil
}

// SinkInfo is Chain.SinkInfo on task's chain.
func (f *Follower) SinkInfo(task, sink string, epoch uint64) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fw := f.mu.tasks[task]; fw != nil {
		return fw.chain.SinkInfo(sink, epoch)
	}
	return nil, false
}

// View is a copy of one chain's state.
type View struct {
	Latest       *Record // nil when the chain has no record
	LatestOffset int64
	MaxEpoch     uint64
	// Next is the queue offset up to which records were applied.
	Next int64
	// History is the owner-epoch history a record of the next owner epoch
	// would carry (see Chain.NextHistory).
	chain *Chain
}

// NextHistory is Chain.NextHistory as of the view.
func (v View) NextHistory(ownerEpoch uint64) []EpochStart { return v.chain.NextHistory(ownerEpoch) }

// Decide is Chain.Decide as of the view.
func (v View) Decide(ownerEpoch, epoch uint64) Verdict { return v.chain.Decide(ownerEpoch, epoch) }

// View returns task's chain as read so far.
func (f *Follower) View(task string) (View, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fw := f.mu.tasks[task]
	if fw == nil {
		return View{}, fmt.Errorf("scaleout: task %s is not followed", task)
	}
	if fw.err != nil {
		return View{}, fw.err
	}
	r, off, _ := fw.chain.Latest()
	return View{Latest: r, LatestOffset: off, MaxEpoch: fw.chain.MaxEpoch(), Next: fw.next, chain: fw.chain.clone()}, nil
}

// WaitPast waits until task's chain was read beyond queue offset off (so a
// record written there has been applied), or ctx ends.
func (f *Follower) WaitPast(ctx context.Context, task string, off int64) error {
	for {
		ch := f.Changed()
		f.mu.Lock()
		fw := f.mu.tasks[task]
		var next int64 = -1
		var err error
		if fw != nil {
			next, err = fw.next, fw.err
		}
		f.mu.Unlock()
		if fw == nil {
			return fmt.Errorf("scaleout: task %s is not followed", task)
		}
		if err != nil {
			return err
		}
		if next > off {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run is one commit queue's pull loop.
func (f *Follower) run(fw *followed) {
	ctx := f.ctx
	bo := backoff.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}
	attempt := 0
	wait := func(err error) bool {
		if ctx.Err() != nil || errors.Is(err, client.ErrClosed) {
			return false // stopping: the follower or its client closed
		}
		if attempt > 0 { // one failed pull (a connection closing) is no news
			f.log.Warn("scaleout: following commit chain", "task", fw.task, "queue", fw.q.String(), "err", err)
		}
		d := bo.Delay(attempt)
		attempt++
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	var end int64
	for {
		start, e, err := f.start(ctx, fw)
		if err == nil {
			f.mu.Lock()
			fw.next = start
			f.mu.Unlock()
			end = e
			break
		}
		if errors.Is(err, ErrChainTruncated) {
			f.fail(fw, err)
			return
		}
		if !wait(err) {
			return
		}
	}
	readyDone := false
	markReady := func() {
		if !readyDone {
			readyDone = true
			close(fw.ready)
			f.mu.Lock()
			f.notifyLocked()
			f.mu.Unlock()
		}
	}
	if fw.next >= end {
		markReady()
	}
	for ctx.Err() == nil {
		f.mu.Lock()
		next := fw.next
		f.mu.Unlock()
		suspend := followSuspend
		if !readyDone {
			suspend = 0
		}
		res, err := f.c.Pull(ctx, client.PullRequest{Queue: fw.q, Offset: next, MaxMsgs: 64, Suspend: suspend, Group: f.group})
		if err != nil {
			if !wait(err) {
				return
			}
			continue
		}
		attempt = 0
		switch res.Status {
		case client.PullOffsetIllegal:
			if res.NextBeginOffset > next || next < res.MinOffset {
				f.fail(fw, fmt.Errorf("%w: %s: records from %d were deleted before they were read (the queue starts at %d)", ErrChainTruncated, fw.q, next, res.MinOffset))
				return
			}
			if !wait(fmt.Errorf("offset %d illegal, queue [%d, %d)", next, res.MinOffset, res.MaxOffset)) {
				return
			}
			continue
		case client.PullNoNewMsg, client.PullNoMatchedMsg:
			f.mu.Lock()
			if res.NextBeginOffset > fw.next {
				fw.next = res.NextBeginOffset
			}
			f.notifyLocked()
			f.mu.Unlock()
			if !readyDone && (res.NextBeginOffset >= end || res.Status == client.PullNoNewMsg) {
				markReady()
			}
			continue
		}
		f.mu.Lock()
		for i := range res.Messages {
			m := &res.Messages[i]
			if m.QueueOffset < fw.next {
				continue
			}
			if r, err := DecodeRecord(m.Body); err == nil && r.Task == fw.task {
				fw.chain.Apply(m.QueueOffset, r)
			}
			fw.next = m.QueueOffset + 1
		}
		if res.NextBeginOffset > fw.next {
			fw.next = res.NextBeginOffset
		}
		f.notifyLocked()
		reached := fw.next >= end
		f.mu.Unlock()
		if reached {
			markReady()
		}
	}
}

func (f *Follower) fail(fw *followed, err error) {
	f.log.Error("scaleout: commit chain unusable", "task", fw.task, "err", err)
	f.mu.Lock()
	fw.err = err
	f.notifyLocked()
	f.mu.Unlock()
	select {
	case <-fw.ready:
	default:
		close(fw.ready)
	}
}

// start finds where to start reading fw's queue: just after the record the
// hint names (anchoring the chain there), else at the queue's beginning
// when nothing was ever deleted from it. It returns that offset and the
// queue's end.
func (f *Follower) start(ctx context.Context, fw *followed) (start, end int64, err error) {
	// The hint is read before the queue's bounds: the owner may append a
	// record and store its offset as the hint at any moment, and a bound
	// read before that hint would be older than it (a live chain taken for
	// a truncated one).
	hint, herr := f.c.QueryConsumerOffset(ctx, f.group, fw.q)
	if f.betweenReads != nil {
		f.betweenReads()
	}
	end, err = f.c.MaxOffset(ctx, fw.q)
	if err != nil {
		return 0, 0, err
	}
	min, err := f.c.MinOffset(ctx, fw.q)
	if err != nil {
		return 0, 0, err
	}
	if herr == nil && hint >= end && hint > 0 {
		// (A hint of 0 on an empty queue is what Apache RocketMQ 4.9
		// answers for a group that never committed an offset: not a
		// sign of loss.)
		//
		// A writer stores the hint after reading its record back: the
		// record existed, and a queue never shrinks but by losing data (a
		// slave promoted without the latest records, a store restored from
		// an older copy). Reading what is left would make an older record
		// the latest valid one.
		return 0, 0, fmt.Errorf("%w: %s ends at %d but the record of %s confirmed at offset %d (the group's hint) is not there: the broker lost records", ErrChainTruncated, fw.q, end, fw.task, hint)
	}
	if herr == nil && hint >= min && hint < end {
		res, err := f.c.Pull(ctx, client.PullRequest{Queue: fw.q, Offset: hint, MaxMsgs: 1, Group: f.group})
		if err != nil {
			return 0, 0, err
		}
		if res.Status == client.PullFound && len(res.Messages) > 0 && res.Messages[0].QueueOffset == hint {
			if r, err := DecodeRecord(res.Messages[0].Body); err == nil && r.Task == fw.task {
				f.mu.Lock()
				fw.chain.Anchor(hint, r)
				f.mu.Unlock()
				return hint + 1, end, nil
			}
		}
		f.log.Warn("scaleout: commit chain hint names no record of the task; reading the queue from its start", "task", fw.task, "hint", hint)
	} else if herr != nil && !errors.Is(herr, client.ErrNoOffset) {
		return 0, 0, herr
	}
	if min > 0 {
		return 0, 0, fmt.Errorf("%w: %s starts at %d (records [0, %d) were deleted, by retention or by hand) and no hint names a valid record of %s", ErrChainTruncated, fw.q, min, min, fw.task)
	}
	return 0, end, nil
}
