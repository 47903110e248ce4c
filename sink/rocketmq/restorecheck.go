package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/internal/backoff"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The restore check. A restore commits the transactions of the checkpoint
// it restored, which the crashed run may have committed already, wholly or
// in part. Apache RocketMQ's broker (4.9 and 5.x) finds a half message by
// its commit log offset whether or not it was ended and stores it again
// for every END_TRANSACTION commit, so a blind repeat duplicates whatever
// the crashed run committed (runnel's broker answers a repeat as done).
// Before committing a transaction it did not send, the sink therefore
// reads its output queues from the transaction's floors (floors.go) and
// leaves out the half messages whose committed copy (same UNIQ_KEY) is
// there.
//
// The crashed run may have left END_TRANSACTIONs in flight that the broker
// has not processed yet. Apache RocketMQ queues them for its end-transaction
// threads (first in, first out) and drops any that waited there longer
// than waitTimeMillsInTransactionQueue (3 s by default). So when something
// is left to commit, the sink sends a barrier first — an END_TRANSACTION
// the broker refuses (a wrong producer group), answered only once the
// requests queued before it were taken — then waits WithRestoreSettle for
// those being processed to be stored, and reads the queues' new tails
// again before committing what is still missing.

// barrierGroupSuffix makes the barrier's producer group differ from the
// half message's (the broker refuses it: "The producer group wrong").
const barrierGroupSuffix = "_runnel_barrier"

// scanPullMsgs is the batch of a restore scan's pulls (brokers cap it: 32
// on Apache RocketMQ).
const scanPullMsgs = 256

// uncommitted returns the handles of d that no committed copy in their
// output queues shows (what the restore still has to commit), in d's
// order. A description without floors (written by an earlier version) is
// committed whole, as before.
func (e *txEngine) uncommitted(ctx context.Context, d *txnDesc) ([]txnHandle, error) {
	if len(d.handles) == 0 {
		return nil, nil
	}
	if d.floors == nil {
		e.log.Warn("rocketmq sink: restoring a transaction without output floors (written by an earlier version): committing it again whole, which duplicates what the crashed run committed on Apache RocketMQ brokers",
			"group", e.group, "checkpoint", d.checkpoint, "records", len(d.handles))
		return d.handles, nil
	}
	start := time.Now()
	want := make(map[string]bool, len(d.handles)) // msgID → committed copy found
	for i := range d.handles {
		h := &d.handles[i].h
		if _, ok := d.floors[queueOf(h)]; !ok {
			return nil, fmt.Errorf("rocketmq sink: restore of checkpoint %d: no floor for output queue %s/%s/%d", d.checkpoint, h.BrokerName, h.Topic, h.QueueID)
		}
		want[h.MsgID] = false
	}
	sc := &restoreScan{e: e, want: want, next: make(map[queueKey]int64, len(d.floors))}
	for k, f := range d.floors {
		sc.next[k] = f
	}
	if err := sc.scan(ctx); err != nil {
		return nil, err
	}
	rest := sc.missing(d.handles)
	first := len(d.handles) - len(rest)
	if len(rest) > 0 {
		if err := e.barrier(ctx, &rest[0].h); err != nil {
			return nil, err
		}
		if err := backoff.Sleep(ctx, e.cfg.restoreSettle); err != nil {
			return nil, err
		}
		if err := sc.scan(ctx); err != nil {
			return nil, err
		}
		rest = sc.missing(d.handles)
	}
	e.log.Info("rocketmq sink: restore: half messages of the restored checkpoint already committed",
		"group", e.group, "checkpoint", d.checkpoint, "records", len(d.handles), "committed", len(d.handles)-len(rest),
		"late", len(d.handles)-len(rest)-first, "read", sc.read, "took", time.Since(start).Round(time.Millisecond))
	return rest, nil
}

// restoreScan reads output queues for committed copies of half messages.
type restoreScan struct {
	e        *txEngine
	attempts int                // tries of each request (0: the sink's)
	next     map[queueKey]int64 // where each queue's next read starts

	mu   sync.Mutex      // the queues' goroutines record under it
	want map[string]bool // msgID → committed copy found
	read int             // messages read, for the log
}

// scan reads every queue from its next offset to its max offset now, the
// queues in parallel, and records the copies it finds.
func (sc *restoreScan) scan(ctx context.Context) error {
	type result struct {
		k   queueKey
		end int64
		err error
	}
	results := make([]result, 0, len(sc.next))
	for k, from := range sc.next {
		results = append(results, result{k: k, end: from})
	}
	var wg sync.WaitGroup
	for i := range results {
		r := &results[i]
		wg.Go(func() { r.end, r.err = sc.scanQueue(ctx, r.k, r.end) })
	}
	wg.Wait()
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		sc.next[r.k] = r.end
	}
	return errors.Join(errs...)
}

// scanQueue reads q from from up to its max offset observed now (with the
// sink's retries), and returns that offset.
func (sc *restoreScan) scanQueue(ctx context.Context, k queueKey, from int64) (int64, error) {
	e := sc.e
	attempts := sc.attempts
	if attempts == 0 {
		attempts = e.cfg.attempts
	}
	q := protocol.MessageQueue{Topic: k.topic, BrokerName: k.broker, QueueID: k.queue}
	var end int64
	err := backoff.Retry(ctx, e.cfg.retry, attempts, nil, func(int) error {
		actx, cancel := attemptCtx(ctx, e.lanes.timeout)
		defer cancel()
		var err error
		end, err = e.c.MaxOffset(actx, q)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("rocketmq sink: restore: max offset of %s: %w", q, err)
	}
	off := from
	for off < end {
		var res *client.PullResult
		err := backoff.Retry(ctx, e.cfg.retry, attempts, nil, func(int) error {
			actx, cancel := attemptCtx(ctx, e.lanes.timeout)
			defer cancel()
			var err error
			res, err = e.c.Pull(actx, client.PullRequest{Queue: q, Offset: off, Group: e.group, MaxMsgs: scanPullMsgs})
			if err == nil && res.Status == client.PullNoNewMsg {
				// Not readable yet where the max offset was observed (a
				// slave behind its master): ask again.
				return fmt.Errorf("no message at %d of %d yet", off, end)
			}
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("rocketmq sink: restore: reading %s at %d: %w", q, off, err)
		}
		switch res.Status {
		case client.PullFound, client.PullNoMatchedMsg:
			sc.mu.Lock()
			for i := range res.Messages {
				if id := res.Messages[i].UniqKey(); id != "" {
					if _, ok := sc.want[id]; ok {
						sc.want[id] = true
					}
				}
			}
			sc.read += len(res.Messages)
			sc.mu.Unlock()
		case client.PullOffsetIllegal:
			if res.NextBeginOffset <= off {
				return 0, fmt.Errorf("rocketmq sink: restore: %s has no offset %d (its offsets are %d..%d)", q, off, res.MinOffset, res.MaxOffset)
			}
			// Messages below the queue's min offset were removed: the
			// floor is older than the broker's retention.
			e.log.Warn("rocketmq sink: restore: output queue's floor below its min offset", "queue", q.String(), "floor", off, "min", res.NextBeginOffset)
		}
		if res.NextBeginOffset <= off {
			return 0, fmt.Errorf("rocketmq sink: restore: reading %s at %d made no progress (%s)", q, off, res.Status)
		}
		off = res.NextBeginOffset
	}
	return max(off, end), nil
}

// missing returns the handles of hs whose copy the scans did not find.
func (sc *restoreScan) missing(hs []txnHandle) []txnHandle {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var rest []txnHandle
	for i := range hs {
		if !sc.want[hs[i].h.MsgID] {
			rest = append(rest, hs[i])
		}
	}
	return rest
}

// barrier sends an END_TRANSACTION for h that the broker refuses (another
// producer group) and waits for its answer: END_TRANSACTIONs the broker
// queued before it have been taken by then. Any answer from the broker
// counts; only a failure to reach it is retried. (Should a broker commit
// h nevertheless, the scan that follows finds its copy.)
func (e *txEngine) barrier(ctx context.Context, h *client.TxHandle) error {
	err := backoff.Retry(ctx, e.cfg.retry, e.cfg.attempts, nil, func(int) error { return e.barrierOnce(ctx, h) })
	if err != nil {
		return fmt.Errorf("rocketmq sink: restore: %w", err)
	}
	return nil
}

// barrierOnce is one try of barrier.
func (e *txEngine) barrierOnce(ctx context.Context, h *client.TxHandle) error {
	b := *h
	b.ProducerGroup = h.ProducerGroup + barrierGroupSuffix
	actx, cancel := attemptCtx(ctx, e.lanes.timeout)
	defer cancel()
	err := e.p.EndTransaction(actx, b, true)
	var pe *protocol.Error
	if err == nil || errors.As(err, &pe) {
		return nil
	}
	return fmt.Errorf("barrier END_TRANSACTION: %w", err)
}

// endVerifier tells whether the broker committed half messages of d whose
// END_TRANSACTION commit went out and lost its answer (a timeout, a closed
// connection), so that the lane committer sends the commit again only for
// those it did not (lanes.go, endRetry): as the restore check does, it
// sends a barrier after the failure, waits WithRestoreSettle and reads the
// output queues from d's floors (then only their new tails) for the
// commits' copies. Lanes ask it concurrently: one round (barrier, settle,
// read) serves every failure before it, and lanes that fail meanwhile wait
// for it. A round makes one try of each request; the lanes' retries try
// again.
type endVerifier struct {
	e *txEngine
	d *txnDesc

	mu      sync.Mutex
	sc      *restoreScan
	settled time.Time    // when the last successful round sent its barrier
	round   *verifyRound // the round in progress, nil when none
}

// verifyRound is one barrier, settle and read of an endVerifier.
type verifyRound struct {
	started time.Time
	done    chan struct{}
	err     error // set before done is closed
}

// committed reports whether a committed copy of h (a half message of v.d
// whose commit failed at failedAt) is in its output queue.
func (v *endVerifier) committed(ctx context.Context, h *client.TxHandle, failedAt time.Time) (bool, error) {
	for {
		v.mu.Lock()
		if err := v.initLocked(); err != nil {
			v.mu.Unlock()
			return false, err
		}
		if v.settled.After(failedAt) {
			v.sc.mu.Lock()
			found := v.sc.want[h.MsgID]
			v.sc.mu.Unlock()
			v.mu.Unlock()
			v.e.log.Info("rocketmq sink: a commit whose answer was lost", "group", v.e.group, "msgId", h.MsgID, "committed", found)
			return found, nil
		}
		if r := v.round; r != nil {
			v.mu.Unlock()
			select {
			case <-r.done:
			case <-ctx.Done():
				return false, ctx.Err()
			}
			if r.err != nil && r.started.After(failedAt) {
				return false, r.err
			}
			continue // settled after failedAt now, or a new round is needed
		}
		r := &verifyRound{started: time.Now(), done: make(chan struct{})}
		v.round = r
		v.mu.Unlock()
		r.err = v.runRound(ctx, h)
		v.mu.Lock()
		if r.err == nil {
			v.settled = r.started
		}
		v.round = nil
		close(r.done)
		v.mu.Unlock()
		if r.err != nil {
			return false, r.err
		}
	}
}

// initLocked sets up the scan of d's output queues from their floors.
func (v *endVerifier) initLocked() error {
	if v.sc != nil {
		return nil
	}
	d := v.d
	sc := &restoreScan{e: v.e, attempts: 1, want: make(map[string]bool, len(d.handles)), next: make(map[queueKey]int64, len(d.floors))}
	for i := range d.handles {
		h := &d.handles[i].h
		if _, ok := d.floors[queueOf(h)]; !ok {
			return fmt.Errorf("rocketmq sink: no floor for output queue %s/%s/%d: cannot tell whether %s was committed", h.BrokerName, h.Topic, h.QueueID, h.MsgID)
		}
		sc.want[h.MsgID] = false
	}
	for k, f := range d.floors {
		sc.next[k] = f
	}
	v.sc = sc
	return nil
}

// runRound sends a barrier (for h), waits the settle and reads the output
// queues' new tails, one try each.
func (v *endVerifier) runRound(ctx context.Context, h *client.TxHandle) error {
	if err := v.e.barrierOnce(ctx, h); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, v.e.cfg.restoreSettle); err != nil {
		return err
	}
	return v.sc.scan(ctx)
}
